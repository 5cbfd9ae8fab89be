"""The process tree a stop ends: orphans of the tree are adopted (a child subreaper) and still
found, ended by (pid, start time), never a stranger's recycled pid."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc, prctl")

# In a process of its own: the test process must not become anyone's subreaper.
SCRIPT = textwrap.dedent("""
    import os, subprocess, sys, time
    from cluster import processes

    assert processes.become_subreaper()
    # a child that starts a grandchild and exits at once: the grandchild is orphaned
    subprocess.run([sys.executable, "-c",
                    "import subprocess, sys; subprocess.Popen([sys.executable, '-c', "
                    "'import time; time.sleep(60)'], start_new_session=True)"], check=True)
    deadline = time.monotonic() + 10
    found = set()
    while not found and time.monotonic() < deadline:
        found = processes.descendants()
        time.sleep(0.05)
    assert len(found) == 1, found
    (pid, start), = found
    assert os.getpgid(pid) == pid  # its own group and session: a group signal misses it
    assert processes.alive({(pid, start)}) == {(pid, start)}
    assert processes.alive({(pid, start + 1)}) == set()  # another start time: not it
    assert processes.end(found, grace_s=1.0) == set()
    print("ended", pid)
""")


def test_an_orphaned_grandchild_is_found_and_ended() -> None:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    pid = int(proc.stdout.split()[1])
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text()


def test_descendants_of_this_process() -> None:
    from cluster import processes

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert child.pid in {pid for pid, _ in processes.descendants()}
        assert processes.end({p for p in processes.descendants() if p[0] == child.pid},
                             grace_s=2.0) == set()
        assert child.wait(timeout=5) is not None
    finally:
        child.kill()
        child.wait()
