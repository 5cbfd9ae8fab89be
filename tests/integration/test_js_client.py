"""The TypeScript client (clients/js) against real parties: node runs the package's live tests
(clients/js/test/live.test.ts) with the URLs of the integration tests' parties and the pages
they serve, and of two more parties serving a keyword table of
tests/vectors/keyword_tables.json; every page and value it reads must be the served one, and
a lying party must be refused.

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

from tests.integration.conftest import delete_apps, deploy

pytestmark = pytest.mark.ray

JS = Path(__file__).resolve().parents[2] / "clients" / "js"
LIVE = JS / "dist" / "test" / "live.test.js"
BUILD = "cd clients/js && npm ci && npm run build"
# the vector table with a tree level of 3 pages: read whole, or privately a page a candidate
KW_TABLE = "deep"


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


@pytest.fixture(scope="module")
def keyword_parties(serve_instance, tmp_path_factory):
    from morphogen.keyword.owner import create_owner_dir
    from tests.vectors.keyword_tables import built

    need_js_client()  # no parties started for a test that would skip
    table, _ = built(KW_TABLE)
    snapshot = create_owner_dir(table, tmp_path_factory.mktemp("jskw") / "owner")
    for name in ("jskwa", "jskwb"):
        deploy(serve_instance, name, snapshot=str(snapshot), num_shards=1)
    yield serve_instance.app_url("jskwa"), serve_instance.app_url("jskwb")
    delete_apps("jskwa", "jskwb")


def test_js_client_reads_pages_and_records(parties, pages, keyword_parties, tmp_path) -> None:
    node = need_js_client()
    served = tmp_path / "pages.bin"
    served.write_bytes(pages.tobytes())
    env = {**os.environ,
           "MORPHOGEN_JS_SERVER_A": parties.app_url("a"),
           "MORPHOGEN_JS_SERVER_B": parties.app_url("b"),
           "MORPHOGEN_JS_PAGES": str(served),
           "MORPHOGEN_JS_KW_A": keyword_parties[0],
           "MORPHOGEN_JS_KW_B": keyword_parties[1],
           "MORPHOGEN_JS_KW_TABLE": KW_TABLE}
    # TAP named: its summary lines are what is checked below, whatever node's default
    run = subprocess.run([node, "--test", "--test-reporter=tap", str(LIVE.relative_to(JS))],
                         cwd=JS, env=env, capture_output=True, text=True, timeout=300)
    report = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, report
    passed = re.search(r"^# pass (\d+)$", run.stdout, re.M)
    # the live tests skip themselves without the variables: none may have been skipped here
    assert passed and int(passed.group(1)) >= 12 and "# SKIP" not in run.stdout, report
    formats = httpx.get(parties.app_url("a") + "/epoch").json()["page_pir"].get("key_formats", [])
    if "packed" in formats:
        assert "# key format packed" in run.stdout, report
