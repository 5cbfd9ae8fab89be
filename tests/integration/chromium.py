"""Headless Chromium for the browser tests, driven over the DevTools protocol (a websocket,
from the `websockets` package the test extras install with web3): open a page, wait for a
promise it leaves in `window`, take a screenshot. Chromium comes from Debian's package
(`apt-get install chromium`; .ci/run installs it), or MORPHOGEN_CHROMIUM names a binary.
Without one a test skips, except where CI is set: there it fails, as for anvil."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

NAMES = ("chromium", "chromium-browser", "google-chrome")
# Debian's `chromium` is a shell script around this binary: started directly, stopping it
# stops the browser, not only the script
DEBIAN_BINARY = "/usr/lib/chromium/chromium"


def need_chromium() -> str:
    """Chromium's path, or this test skipped (failed where CI is set)."""
    debian = DEBIAN_BINARY if os.access(DEBIAN_BINARY, os.X_OK) else None
    found = os.environ.get("MORPHOGEN_CHROMIUM") or debian or next(
        (p for p in map(shutil.which, NAMES) if p), None)
    if found:
        return found
    reason = "no Chromium on PATH (apt-get install chromium, or set MORPHOGEN_CHROMIUM)"
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI must run the browser tests", pytrace=False)
    pytest.skip(reason)


class Page:
    """One tab over the DevTools protocol."""

    def __init__(self, ws: Any) -> None:
        self._ws, self._ids = ws, itertools.count(1)

    def call(self, method: str, timeout_s: float = 30.0, **params: Any) -> dict:
        """The result of one command; events that arrive meanwhile are dropped."""
        rid = next(self._ids)
        self._ws.send(json.dumps({"id": rid, "method": method, "params": params}))
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == rid:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def open(self, url: str, timeout_s: float = 60.0) -> None:
        """Navigate and wait for the load event (module scripts have run by then)."""
        self.call("Page.enable")
        self.call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout_s
        while True:
            msg = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("method") == "Page.loadEventFired":
                return

    def awaited(self, expression: str, timeout_s: float = 120.0) -> Any:
        """The JSON value of a promise the page holds (`window.results`)."""
        got = self.call("Runtime.evaluate", timeout_s=timeout_s, expression=expression,
                        awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"the page failed: {got['exceptionDetails']}")
        return got["result"].get("value")

    def screenshot(self, path: Path) -> None:
        data = self.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        path.write_bytes(base64.b64decode(data["data"]))


@contextmanager
def chromium(binary: str) -> Iterator[Page]:
    """A headless Chromium of its own profile, and its first tab; stopped at the end."""
    from websockets.sync.client import connect

    profile = tempfile.mkdtemp(prefix="mgchrome")
    proc = subprocess.Popen(
        [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--no-default-browser-check", "--disable-extensions",
         "--window-size=1100,900", f"--user-data-dir={profile}",
         "--remote-debugging-port=0", "about:blank"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        active = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (active.is_file() and active.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Chromium did not start (exit {proc.poll()})")
            time.sleep(0.1)
        port = int(active.read_text().split()[0])
        targets = httpx.get(f"http://127.0.0.1:{port}/json/list", timeout=10).json()
        tab = next(t for t in targets if t.get("type") == "page")
        with connect(tab["webSocketDebuggerUrl"], max_size=None, open_timeout=30) as ws:
            yield Page(ws)
    finally:
        # the browser and its renderers: the process group it leads
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        shutil.rmtree(profile, ignore_errors=True)
