"""A local anvil (Foundry's dev node) for the chain tests: found, started on a free port,
stopped after.

The binary is `MORPHOGEN_ANVIL`, else the pinned one `.ci/run` installs from npm under
`.tools/`, else `anvil` on PATH. Without one a test skips, except where `CI` is set: there a
missing node must not pass as a green run, so it fails.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
# npm installs the platform's binary as an optional package: anvil-linux-amd64 here
INSTALLED = ".tools/node_modules/@foundry-rs/anvil-*/bin/anvil"
INSTALL = "npm install --no-audit --no-fund --prefix .tools @foundry-rs/anvil@1.7.1"
# anvil's default mnemonic funds these ten with 10,000 ETH each; the first signs for
# eth_sendTransaction without a key (anvil unlocks its own accounts)
DEV_ACCOUNTS = [
    "0xf39fd6e51aad88f6f4ce6ab8827279cfffb92266", "0x70997970c51812dc3a010c7d01b50e0d17dc79c8",
    "0x3c44cdddb6a900fa2b585dd299e03d12fa4293bc", "0x90f79bf6eb2c4f870365e785982e1f101e93b906",
    "0x15d34aaf54267db7d7c367839aaf71a00a2c6a65", "0x9965507d1a55bcc2695c58ba16fb37d819b0a4dc",
    "0x976ea74026e726554db657fa54763abd0c3a0aa9", "0x14dc79964da2c08b23698b3d3cc7ca32193d9955",
    "0x23618e81e3f5cdf7f54c3d65f7fbc0abf5b21e8f", "0xa0ee7a142d267c1f36714e4a8f75612f20a79720",
]
DEV_BALANCE = 10_000 * 10**18


def anvil_binary() -> str | None:
    named = os.environ.get("MORPHOGEN_ANVIL")
    if named:
        return named
    installed = sorted(ROOT.glob(INSTALLED))
    if installed:
        return str(installed[0])
    return shutil.which("anvil")


def need_anvil() -> str:
    """The anvil binary, or this test skipped (failed where CI is set)."""
    found = anvil_binary()
    if found and Path(found).is_file():
        return found
    reason = (f"anvil not found (MORPHOGEN_ANVIL {found!r})" if found else
              f"anvil not found: install it with `{INSTALL}` or set MORPHOGEN_ANVIL")
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI must run the chain tests", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    """A port for anvil to bind: below the ephemeral range, so that no connection of this
    machine is handed it before anvil binds it."""
    from cluster.local import listener_port

    return listener_port()


@contextlib.contextmanager
def running_anvil(chain_id: int = 31337, *, start_s: float = 30.0,
                  args: Sequence[str] = ()) -> Iterator[str]:
    """Start anvil on 127.0.0.1 (with `args` added to its command line, e.g. a hardfork),
    wait until it answers eth_chainId, yield its URL; it is killed on the way out."""
    binary = need_anvil()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([binary, "--silent", "--host", "127.0.0.1", "--port", str(port),
                             "--chain-id", str(chain_id), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + start_s
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace").strip() if proc.stderr else ""
                raise RuntimeError(f"anvil exited with {proc.returncode} at start: {err[-400:]}")
            try:
                answer = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                               "params": []}, timeout=2)
                if answer.json().get("result") == hex(chain_id):
                    break
            except (httpx.TransportError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"anvil did not answer eth_chainId within {start_s:g} s")
            time.sleep(0.05)
        yield url
    finally:
        proc.kill()
        proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


VIEM_INSTALLED = ROOT / ".tools" / "node_modules" / "viem" / "_esm" / "index.js"
VIEM_INSTALL = "npm install --no-audit --no-fund --prefix .tools viem@2.57.20"


def need_viem() -> str:
    """A file URL of viem's ESM entry (and node on PATH), or this test skipped (failed where CI
    is set, as for anvil)."""
    named = os.environ.get("MORPHOGEN_VIEM")
    found = Path(named) if named else VIEM_INSTALLED
    if found.is_file() and shutil.which("node"):
        return found.as_uri()
    reason = f"viem or node not found: install it with `{VIEM_INSTALL}` or set MORPHOGEN_VIEM"
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI must run the wallet tests", pytrace=False)
    pytest.skip(reason)


def need_node_evm() -> None:
    """The wallet endpoint's node EVM (node and clients/js built), or this test skipped
    (failed where CI is set, as for anvil)."""
    from morphogen.wallet import node_evm

    why = node_evm.available()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"{why}; CI must run the node EVM's tests", pytrace=False)
    pytest.skip(why)
