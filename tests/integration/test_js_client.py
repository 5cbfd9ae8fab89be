"""The TypeScript client (clients/js) against the real parties of the integration tests: node
runs the package's live test (clients/js/test/live.test.ts) with the parties' URLs and the
pages they serve, and every page it reads must be the served one.

Needs node on PATH and the package built (`npm ci && npm run build` in clients/js, which
.ci/run does before the tests); skipped without them, failed where CI is set.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.ray

JS = Path(__file__).resolve().parents[2] / "clients" / "js"
LIVE = JS / "dist" / "test" / "live.test.js"
BUILD = "cd clients/js && npm ci && npm run build"


def need_js_client() -> str:
    """node's path, or this test skipped (failed where CI is set, as for anvil)."""
    node = shutil.which("node")
    if node and LIVE.is_file():
        return node
    reason = ("node is not on PATH" if not node else
              f"the TypeScript client is not built: run `{BUILD}`")
    if os.environ.get("CI"):
        pytest.fail(reason + "; CI must run the TypeScript client's tests", pytrace=False)
    pytest.skip(reason)


def test_js_client_reads_the_served_pages(parties, pages, tmp_path) -> None:
    node = need_js_client()
    served = tmp_path / "pages.bin"
    served.write_bytes(pages.tobytes())
    env = {**os.environ,
           "MORPHOGEN_JS_SERVER_A": parties.app_url("a"),
           "MORPHOGEN_JS_SERVER_B": parties.app_url("b"),
           "MORPHOGEN_JS_PAGES": str(served)}
    # TAP named: its summary lines are what is checked below, whatever node's default
    run = subprocess.run([node, "--test", "--test-reporter=tap", str(LIVE.relative_to(JS))],
                         cwd=JS, env=env, capture_output=True, text=True, timeout=300)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    passed = re.search(r"^# pass (\d+)$", run.stdout, re.M)
    # the live tests skip themselves without the variables: none may have been skipped here
    assert passed and int(passed.group(1)) >= 8 and "# SKIP" not in run.stdout, report
    formats = httpx.get(parties.app_url("a") + "/epoch").json()["page_pir"].get("key_formats", [])
    if "packed" in formats:
        assert "# key format packed" in run.stdout, report
