"""`morphogen rpc`: a wallet's Ethereum JSON-RPC endpoint over private, verified state.

Point a wallet's or a library's RPC URL at it. Balances, nonces, storage words and code at the
block the parties serve are read privately from the keyword tables a `chain follow` publishes,
each answer proven against the owner's signed root; the chain id and block number are the
signed block's. eth_call and eth_estimateGas run in a local EVM (revm) whose every read is
such a lookup. Everything else (sending transactions, receipts, logs, other blocks) goes to
--upstream when it is given, and that node sees it: it is not private. Without --upstream such
a request is a JSON-RPC error naming the method. (`morphogen.wallet`.)
"""

from __future__ import annotations

import argparse
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from cluster import inputs
from cluster.errors import CommandFailed, UsageError


def cmd_rpc(args: argparse.Namespace) -> int:
    from morphogen.chain.rpc import display_url
    from morphogen.client import PirClient, PirError
    from morphogen.keyword import KeywordIntegrityError, StaleTableError, TableChangingError
    from morphogen.wallet import CallService, Endpoint, PrivateState, RpcServer, Upstream
    from morphogen.wallet.guard import LOOPBACK_HOSTS
    from morphogen.wallet.methods import METHODS

    url_a, url_b = inputs.two_parties(args.server_a, args.server_b)
    if args.max_age is not None and not args.max_age > 0:
        raise UsageError("--max-age is a number of seconds above 0")
    if args.max_batch < 1:
        raise UsageError("--max-batch is at least 1")
    if args.chain_id is not None and args.chain_id < 1:
        raise UsageError("--chain-id is a chain's id, 1 or more")
    if args.call_processes < 0:
        raise UsageError("--call-processes is 0 (no eth_call here) or more")
    if not args.call_time > 0:
        raise UsageError("--call-time is a number of seconds above 0")
    if args.request_time is not None and not args.request_time > 0:
        raise UsageError("--request-time is a number of seconds above 0")
    if args.watch < 0:
        raise UsageError("--watch is a number of seconds, 0 or more (0: no watching)")
    hosts = [h.strip() for a in args.allowed_hosts for h in a.split(",") if h.strip()] \
        or list(LOOPBACK_HOSTS)
    with PirClient(url_a, url_b, encoding=args.encoding, timeout_s=args.timeout) as pir:
        try:
            state = PrivateState(pir, args.public_key, max_age=args.max_age,
                                 min_block=args.min_block, watch_s=args.watch or None,
                                 chain_id=args.chain_id)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--public-key {exc}") from None
        try:
            head = state.head()
        except (PirError, StaleTableError, KeywordIntegrityError, TableChangingError) as exc:
            state.close()
            raise CommandFailed(f"the parties' chain tables: {exc}") from None
        upstream = Upstream(args.upstream, args.timeout) if args.upstream else None
        # what a call sees of its block (GASLIMIT, COINBASE, ...) from the upstream's header,
        # checked against the signed hash; one header request a block, whatever is asked
        headers = upstream.header if upstream is not None else None
        evm = _evm(args.evm) if args.call_processes else None
        try:
            calls = CallService(state, processes=args.call_processes, run_s=args.call_time,
                                headers=headers, evm=evm, hardfork=args.hardfork) \
                if evm is not None else None
        except RuntimeError as exc:  # an EVM process that does not start
            state.close()
            raise CommandFailed(f"eth_call's EVM ({evm}): {exc}") from None
        endpoint = Endpoint(state, forward=upstream, max_batch=args.max_batch,
                            calls=calls.calls if calls else None)
        try:
            server = RpcServer(endpoint, args.host, args.port, cors_origins=args.cors_origin,
                               allowed_hosts=hosts, request_s=args.request_time)
        except OSError as exc:
            if calls is not None:
                calls.close()
            state.close()
            raise CommandFailed(f"cannot listen on {args.host}:{args.port}: "
                                f"{exc.strerror or exc}") from None
        print(f"[rpc] chain {head.chain_id}, block {head.number} ({head.hash}), served by "
              f"{url_a} and {url_b}", flush=True)
        private = [*METHODS, *(("eth_call", "eth_estimateGas") if calls else ())]
        print(f"[rpc] answered privately and verified: {', '.join(private)} (latest block)",
              flush=True)
        if calls is not None:
            rules = args.hardfork if evm == "ethereumjs" else "revm 8's PRAGUE"
            print(f"[rpc] eth_call runs in {evm} ({rules})", flush=True)
        if upstream is not None:
            print(f"[rpc] every other request goes to {display_url(args.upstream)}, which sees "
                  "it: NOT private", flush=True)
        else:
            print("[rpc] every other request is refused (no --upstream)", flush=True)
        if args.cors_origin:
            print(f"[rpc] browser origins allowed: {', '.join(args.cors_origin)}", flush=True)
        print(f"[rpc] Host names served: "
              f"{', '.join(hosts)}", flush=True)
        print(f"[rpc] listening on {server.url}", flush=True)
        try:
            with _stop_on_term(server):
                server.serve_forever()
        except KeyboardInterrupt:
            print("[rpc] stopped", flush=True)  # Ctrl-C or SIGTERM: a clean stop
        finally:
            server.server_close()
            if calls is not None:
                calls.close()
            if upstream is not None:
                upstream.close()
            state.close()
    return 0


def _evm(asked: str) -> str:
    """The EVM `--evm` names; auto: ethereumjs where it can run here, else revm (saying why)."""
    from morphogen.wallet import node_evm

    why = node_evm.available()
    if asked == "ethereumjs" and why is not None:
        raise UsageError(f"--evm ethereumjs: {why}")
    if asked == "auto":
        if why is None:
            return "ethereumjs"
        print(f"[rpc] eth_call runs in revm (pyrevm 0.3.7, no Osaka, no calls from smart "
              f"accounts): the ethereumjs EVM cannot run here: {why}", flush=True)
        return "revm"
    return asked


@contextmanager
def _stop_on_term(server) -> Iterator[None]:
    """SIGTERM ends serve_forever as Ctrl-C does (shutdown() from a handler would deadlock the
    thread that runs the loop, so the handler raises instead)."""
    def stop(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop) if _main_thread() else None
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


def add_parsers(sub: argparse._SubParsersAction) -> list[argparse.ArgumentParser]:
    from morphogen.wallet.evm import RUN_S
    from morphogen.wallet.jsonrpc import MAX_BATCH
    from morphogen.wallet.server import REQUEST_S

    rpc = sub.add_parser("rpc", help="a wallet's Ethereum JSON-RPC endpoint, private and verified",
                         description=__doc__,
                         formatter_class=argparse.RawDescriptionHelpFormatter)
    rpc.add_argument("--server-a", required=True, metavar="URL", help="party A's URL")
    rpc.add_argument("--server-b", required=True, metavar="URL", help="party B's URL")
    rpc.add_argument("--public-key", required=True, metavar="FILE|HEX",
                     help="the chain tables' owner key (owner.pub of chain build's key)")
    rpc.add_argument("--upstream", default=None, metavar="URL",
                     help="a node for every request not answered privately (it sees them)")
    rpc.add_argument("--host", default="127.0.0.1", help="address to listen on (default "
                     "127.0.0.1: this machine only)")
    rpc.add_argument("--port", type=int, default=8545, help="port (default 8545)")
    rpc.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                     help="a browser origin allowed to call it (repeat; * for any): none "
                          "by default")
    rpc.add_argument("--allowed-hosts", action="append", default=[], metavar="NAME",
                     help="Host names requests may name (comma-separated or repeated; * for "
                          "any): by default localhost, 127.0.0.1 and ::1, which keeps "
                          "DNS-rebinding pages out; "
                          "name this machine's when listening on another --host")
    rpc.add_argument("--max-age", type=float, default=None, metavar="S",
                     help="refuse state the owner made more than S seconds ago")
    rpc.add_argument("--min-block", type=int, default=0, metavar="N",
                     help="refuse state older than block N")
    rpc.add_argument("--chain-id", type=int, default=None, metavar="ID",
                     help="refuse tables of another chain (signed with the same key); "
                          "without it, the chain of the first version read is kept")
    rpc.add_argument("--max-batch", type=int, default=MAX_BATCH, metavar="N",
                     help=f"requests a batch may hold (default {MAX_BATCH})")
    rpc.add_argument("--call-processes", type=int, default=2, metavar="N",
                     help="processes running eth_call and eth_estimateGas (--evm) over private "
                          "state (default 2; 0: those go upstream or are refused)")
    rpc.add_argument("--evm", choices=["auto", "ethereumjs", "revm"], default="auto",
                     help="the EVM eth_call runs in: ethereumjs (node processes: today's forks, "
                          "calls from smart accounts; needs node and clients/js built), revm "
                          "(pyrevm 0.3.7: revm 8's draft Prague), or auto (default: ethereumjs "
                          "where it can run, else revm)")
    rpc.add_argument("--hardfork", choices=["chain", "prague", "osaka"], default="chain",
                     help="ethereumjs's rules: chain (default: a public chain's fork at the "
                          "served block, Osaka on any other chain), or one fork")
    rpc.add_argument("--call-time", type=float, default=RUN_S, metavar="S",
                     help=f"EVM seconds one eth_call or eth_estimateGas may run, its runs "
                          f"together, waiting for reads not counted (default {RUN_S:g}); past "
                          "it the run is stopped and the answer is a timeout error")
    rpc.add_argument("--request-time", type=float, default=REQUEST_S, metavar="S",
                     help=f"seconds a request (a batch: all of it) may take; past it what is "
                          f"left of it is not run and is answered 'request timed out' (default "
                          f"{REQUEST_S:g}, a node's). A request whose client goes away is "
                          "given up at once")
    rpc.add_argument("--watch", type=float, default=0.5, metavar="S",
                     help="every S seconds, ask the parties whether they serve a new block and "
                          "read its signed descriptors before a request needs them (default "
                          "0.5; 0: never, the first request at a new block reads them)")
    rpc.add_argument("--encoding", choices=("json", "msgpack"), default="json",
                     help="encoding towards the parties (default json)")
    rpc.add_argument("--timeout", type=float, default=30.0, metavar="S",
                     help="seconds a party's or the upstream's answer may take (default 30)")
    rpc.set_defaults(func=cmd_rpc)
    return [rpc]

