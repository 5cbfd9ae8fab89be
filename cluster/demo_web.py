"""`morphogen demo --web`: a wallet's private reads, shown in a browser.

A local Ray cluster serves two parties of a small synthetic chain (accounts, and a token whose
balances some of them hold), built as the follower builds a chain's tables and signed by a
fresh owner key; a page of the TypeScript client (clients/js/test/browser/chain.html, with
viem and the private provider) is served on a loopback port of its own, which the parties list
as an origin that may read them (CORS). Opening its address shows the address asked, its
balance and its token balance (an eth_call run in the page's EVM), the block they are proven
at, and what each party was sent. It serves until interrupted.

The page is built by `npm ci && npm run bundle:pages` in clients/js.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlencode

from cluster.report import eprint

JS = Path(__file__).resolve().parents[1] / "clients" / "js"
PAGE_FILES = {"/chain.html": JS / "test" / "browser" / "chain.html",
              "/chain-page.js": JS / "dist" / "browser-pages" / "chain-page.js",
              "/chain-page.js.map": JS / "dist" / "browser-pages" / "chain-page.js.map"}
BUILD = "cd clients/js && npm ci && npm run bundle:pages"
CHAIN_ID = 31337
BLOCK = 1
TOKEN_UNIT = 10**18


@dataclass(frozen=True)
class DemoChain:
    """The synthetic chain's records, and what the page asks of it with the answers due."""

    records: object  # morphogen.chain.export.StateRecords
    holder: bytes
    token: bytes
    balance: int
    token_balance: int


def demo_chain(accounts: int, seed: int = 0) -> DemoChain:
    """`accounts` accounts (a tenth of them holding the token) and the token, from `seed`."""
    from morphogen.chain.export import StateRecords
    from morphogen.chain.state import (
        Account,
        account_record,
        code_records,
        keccak256,
        storage_records,
    )
    from morphogen.chain.token_code import token_code, token_storage

    rng = random.Random(f"morphogen demo chain {seed}")
    addresses = list(dict.fromkeys(rng.randbytes(20) for _ in range(max(accounts, 2))))
    balances = {a: rng.randrange(1, 10**6) * TOKEN_UNIT for a in addresses[::10]}
    wei = {a: rng.randrange(10**21) for a in addresses}
    token = rng.randbytes(20)
    code = token_code("DEMO")
    records = StateRecords(
        [account_record(a, Account(rng.randrange(100), wei[a], keccak256(b""))) for a in addresses]
        + [account_record(token, Account(1, 0, keccak256(code)))],
        list(storage_records(token, token_storage(balances))),
        list(code_records(code)))
    holder = addresses[0]
    return DemoChain(records, holder, token, wei[holder], balances[holder])


def page_missing() -> str | None:
    missing = [str(p.relative_to(JS)) for p in PAGE_FILES.values() if not p.is_file()]
    return None if not missing else (f"the page is not built ({', '.join(missing)}): run "
                                     f"`{BUILD}`")


def serve_page(host: str, port: int, files: Mapping[str, Path] = PAGE_FILES
               ) -> ThreadingHTTPServer:
    """`files` (URL path -> file; the page's by default) on `host:port` (0: a free port), in a
    thread of their own."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
            path = files.get(self.path.split("?")[0])
            if path is None or not path.is_file():
                self.send_error(404)
                return
            body = path.read_bytes()
            self.send_response(200)
            kind = {".html": "text/html", ".js": "text/javascript"}.get(path.suffix,
                                                                       "application/json")
            self.send_header("Content-Type", kind + "; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="demo-page", daemon=True).start()
    return server


def run_web_demo(args: argparse.Namespace) -> int:
    from cluster import local

    missing = page_missing()
    if missing:
        eprint(f"[demo] {missing}")
        return 2
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    workdir = tempfile.mkdtemp(prefix="morphogen-demo-web-")
    page = serve_page("127.0.0.1", args.web_port)
    origin = f"http://127.0.0.1:{page.server_address[1]}"
    eprint(f"[demo] starting a local Ray cluster ({os.cpu_count()} cores)")
    cluster = local.start(port=args.port, num_cpus=max(2, os.cpu_count() or 2),
                          disable_auth=True, temp_dir=None)
    try:
        url = _parties(args, cluster, workdir, origin)
        print(f"open {url}", flush=True)
        eprint("[demo] serving until interrupted (Ctrl-C)")
        while not stop.wait(0.5):
            pass
    finally:
        eprint("[demo] shutting down")
        page.shutdown()
        page.server_close()
        local.stop(cluster)
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _parties(args: argparse.Namespace, cluster, workdir: str, origin: str) -> str:
    """Both parties of the demo chain, listing `origin`; the page's address."""
    from ray import serve

    from cluster import local
    from deployments.app import build_app
    from morphogen.chain.tables import build_chain_tables
    from morphogen.config import PartyConfig
    from morphogen.keyword.descriptor import Anchor
    from morphogen.keyword.owner import create_owner_dir
    from morphogen.keyword.signing import generate_key_files, load_signing_key, public_bytes

    root = Path(workdir)
    key = load_signing_key(generate_key_files(root / "owner.key")[0])
    chain = demo_chain(args.records, args.seed)
    t = time.monotonic()
    table = build_chain_tables(chain.records, key, Anchor(CHAIN_ID, BLOCK, "0x" + "d0" * 32))
    snapshot = create_owner_dir(table, root / "owner")
    eprint(f"[demo] chain tables: {args.records} accounts and a token, "
           f"{len(table.pages)} pages, built in {time.monotonic() - t:.1f}s")
    urls = []
    for name in ("a", "b"):
        cfg = PartyConfig(snapshot=str(snapshot), cache_dir=workdir, num_shards=1,
                          engine=args.engine, shard_num_cpus=0.25, router_num_cpus=0.1,
                          graceful_shutdown_timeout_s=1.0, cors_origins=(origin,))
        serve.run(build_app(cfg), name=name, route_prefix=f"/{name}", blocking=False)
        urls.append(cluster.app_url(f"/{name}"))
    local.wait_routed(urls)
    eprint(f"[demo] parties at {urls[0]} and {urls[1]}, open to the page's origin {origin}")
    query = {"a": urls[0], "b": urls[1], "owner": public_bytes(key.public_key()).hex(),
             "holder": "0x" + chain.holder.hex(), "token": "0x" + chain.token.hex()}
    return f"{origin}/chain.html?{urlencode(query)}"
