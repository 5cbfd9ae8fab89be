"""`morphogen serve` waits for its stop signal in the main thread (`Stopper.wait`): a SIGTERM
the kernel hands another thread (as it may, to one of Ray's) still stops it, and so does one
sent to the process while the main thread had the signals blocked. Either would have left an
hour's sleep asleep: the script then outlives the run's timeout."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import os, signal, sys, threading, time
    from cluster.shutdown import Stopper, StopRequested

    how = sys.argv[1]
    stopper = Stopper(bound_s=60)  # its watchdog never fires within this script
    stopper.install()
    if how == "blocked":
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def send():
        time.sleep(0.3)
        if how == "thread":  # to this very thread, not the main one
            signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
        else:
            os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # alive, as Ray's threads are

    threading.Thread(target=send, daemon=True).start()
    try:
        stopper.wait()
    except StopRequested as stop:
        print(f"stopped on {stop}", flush=True)
        os._exit(0)
""")


@pytest.mark.parametrize("how", ["thread", "blocked"])
def test_the_wait_sees_a_signal_another_thread_took(how: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "stopped on SIGTERM", done.stdout
