"""`morphogen serve`: one or more parties on a local Ray cluster it starts (or on one it joins
with `--address`), until SIGINT or SIGTERM.

Everything that can be checked before deploying is, and refused on one line: the plan (flags,
config file), the snapshots, the HTTP port, the application names and routes already on the
cluster, and whether the replicas fit its free CPUs and GPUs. The stop is bounded
(`cluster.shutdown`), and only what this process deployed is deleted.
"""

from __future__ import annotations

import argparse
import functools
import os
import time

from cluster import local, processes, ray_access, resources, serve_plan
from cluster.deploy_watch import DeployWatch, run_watched
from cluster.errors import CommandFailed, UsageError, one_line, report
from cluster.report import eprint
from cluster.shutdown import STOP_BOUND_S, Stopper, StopRequested, exit_now
from deployments import start_board
from deployments.naming import INDEX_APP_NAME


def _snapshot_summary(party: serve_plan.PartyPlan, matrix_flag: str | None) -> str:
    from morphogen.snapshot.layout import shard_ranges
    from morphogen.snapshot.manifest import SnapshotError
    from morphogen.snapshot.source import open_snapshot
    from morphogen.storage.location import is_remote
    from morphogen.storage.settings import configure

    configure(party.config.store_settings())
    path = str(party.config.snapshot)
    what = f"--matrix {matrix_flag}" if matrix_flag else f"party {party.name}'s snapshot {path}"
    try:
        with open_snapshot(party.config, progress=True) as snap:
            shard_ranges(snap.num_pages, party.config.num_shards)
            return (f"{snap.num_pages} pages, domain {snap.domain_bits} bits, "
                    f"epoch {snap.epoch_id}")
    except SnapshotError as exc:
        problem = str(exc).removeprefix(f"{path}: ")
        if is_remote(path):  # the store's own hint says what to check (credentials, URI, ...)
            raise UsageError(f"{what}: {problem}") from None
        raise UsageError(f"{what}: {problem}; build one with `morphogen build --raw FILE --out "
                         "DIR` (or --synthetic PAGES)") from None
    except ValueError as exc:  # more shards than pages
        raise UsageError(f"--shards {party.config.num_shards}: {exc}") from None


def _check_port(plan: serve_plan.ServePlan) -> None:
    if local.port_in_use(plan.host, plan.port):
        raise UsageError(
            f"--port {plan.port}: {plan.host}:{plan.port} is in use (another server, or one "
            "still stopping): stop it or pick another --port"
        )


def _check_http(args: argparse.Namespace, cluster: local.LocalCluster) -> None:
    """Joining a cluster whose Serve already listens: its host and port are every
    application's, and a flag asking for others cannot be honoured."""
    for flag, wanted, actual in (("--port", args.port, cluster.port),
                                 ("--host", args.host, cluster.host)):
        if wanted is not None and wanted != actual:
            raise UsageError(
                f"{flag} {wanted}: Serve on this cluster already listens on "
                f"{cluster.host}:{cluster.port}, shared by every application: drop {flag} "
                f"(this party's URLs start with {cluster.url})"
            )


def _check_names(plan: serve_plan.ServePlan) -> None:
    """Deploying under a name in use replaces that application: refused, whoever started it."""
    routes = local.app_routes()
    by_route = {r: n for n, r in routes.items() if r}
    for p in plan.parties:
        if p.name in routes:
            raise UsageError(
                f"application {p.name!r} already runs on this cluster (at {routes[p.name]}); "
                "serve never replaces an application: give this party another --name (or "
                "--route-prefix), or stop the process that serves it"
            )
        if p.route_prefix in by_route:
            raise UsageError(
                f"route {p.route_prefix} is taken by application {by_route[p.route_prefix]!r}: "
                "give this party another --route-prefix (or --name)"
            )


def _check_resources(plan: serve_plan.ServePlan, owns: bool) -> None:
    import ray

    gpus = float(ray.cluster_resources().get("GPU", 0.0))
    demands = [resources.PartyDemand.of(p.name, p.config, gpus) for p in plan.parties]
    resources.check(demands, resources.Capacity.of_cluster(), owns=owns)


def _check_cpus_before_start(plan: serve_plan.ServePlan, num_cpus: int | None) -> None:
    """The CPU demand against the cluster about to be started here, before Ray starts: that
    cluster will have `--num-cpus` (else at most this host's CPUs) and nothing else on it, so a
    plan refused now would be refused once it is up, and the refusal costs no Ray start and
    stop (on a loaded host those took half a minute). GPUs are checked once Ray has counted
    them (`_check_resources`)."""
    cpus = float(num_cpus if num_cpus is not None else os.cpu_count() or 1)
    demands = [resources.PartyDemand.of(p.name, p.config, 0.0) for p in plan.parties]
    resources.check(demands, resources.Capacity({"CPU": cpus}, largest_node={"CPU": cpus}),
                    owns=True, gpus=False)


def _deploy(plan: serve_plan.ServePlan, summaries: list[str], deployed: list[str],
            owns: bool) -> None:
    from ray import serve

    from deployments.app import build_app, build_index_app

    for party, summary in zip(plan.parties, summaries, strict=True):
        eprint(f"[serve] deploying party {party.name} at {party.route_prefix}: "
               f"{party.config.num_shards} shard(s), {summary}")
        try:
            app = build_app(party.config)
        except ValueError as exc:
            raise UsageError(f"party {party.name}: {exc}") from None
        deployed.append(party.name)  # before: a stop during the deployment deletes it
        start_board.clear(party.name)
        watch = DeployWatch(party.name)
        try:
            run_watched(functools.partial(serve.run, app, name=party.name,
                                          route_prefix=party.route_prefix, blocking=False),
                        watch)
        except RuntimeError as exc:
            reasons = watch.failures()
            why = "; ".join(reasons) if reasons else one_line(exc)[:600]
            raise CommandFailed(f"party {party.name} failed to deploy: {why}"
                                " (--verbose shows Ray's logs)") from None
    if owns and all(p.route_prefix != "/" for p in plan.parties):
        deployed.append(INDEX_APP_NAME)
        routes = {p.name: p.route_prefix for p in plan.parties}
        serve.run(build_index_app(routes), name=INDEX_APP_NAME, route_prefix="/",
                  blocking=False)


def _announce(plan: serve_plan.ServePlan, cluster: local.LocalCluster) -> None:
    urls = [cluster.app_url(p.route_prefix) for p in plan.parties]
    for p, url in zip(plan.parties, urls, strict=True):
        print(f"party {p.name}: {url}")
    addr = ray_access.address()
    print(f"ray address: {addr} ({ray_access.auth_line()})")
    for url in ray_access.metrics_urls():
        print(f"metrics: {url}")
    if len(urls) >= 2:
        print(f"try: morphogen get --server-a {urls[0]} --server-b {urls[1]} 0 1 2")
    print(f"join: morphogen serve --address {addr} --name NAME   (another party, same port)")
    print(f"ready; SIGINT (Ctrl-C) or SIGTERM stops it within {STOP_BOUND_S:.0f} s", flush=True)


def _start(args: argparse.Namespace, plan: serve_plan.ServePlan) -> local.LocalCluster:
    if args.address is None:
        # explicit, where Ray would switch it on by default with a warning
        os.environ.setdefault(ray_access.AUTH_ENV, "token")
    try:
        return local.start(host=plan.host, port=plan.port, address=args.address,
                           num_cpus=args.num_cpus, quiet=not args.verbose,
                           metrics_port=args.metrics_port)
    except (ConnectionError, ValueError) as exc:
        if args.address is None:
            raise
        raise UsageError(ray_access.join_failure(args.address, exc)) from None


def _wait_port_free(plan: serve_plan.ServePlan, stopper: Stopper) -> bool:
    deadline = time.monotonic() + stopper.remaining()
    while local.port_in_use(plan.host, plan.port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


LATE_QUIET_S = 0.5  # no new process for this long: the stop has ended every one


def _stop(stopper: Stopper, plan: serve_plan.ServePlan, owns: bool,
          deployed: list[str]) -> bool:
    """Delete what this process deployed; with a cluster of its own, stop Ray and end every
    process it left. A step is abandoned as soon as the head processes are seen dead; False
    then (Ray's own exit hook would wait on the dead cluster: the caller exits at once)."""
    import sys

    stopper.enter_stop()
    ray = sys.modules.get("ray")
    started = ray is not None and ray.is_initialized()
    if owns:
        stopper.tracked |= processes.descendants()
    clean = True
    if started:

        def dead() -> bool:
            return owns and not local.head_alive()

        if deployed:
            clean = stopper.run_step(lambda: local.delete_apps(deployed), dead)
        if clean:
            clean = stopper.run_step(ray.shutdown, dead)
    if owns:
        stopper.tracked |= processes.descendants()
        # a cluster stopped cleanly leaves little to end, gently; one abandoned, its workers
        grace = 2.0 if clean else 0.5
        left = processes.end(stopper.tracked, grace_s=min(grace, stopper.remaining()))
        # a raylet stopped while it was starting workers (shards still waiting to be placed),
        # or a step abandoned while Ray was stopping, leaves some that appear (or are adopted
        # by this process) after the scan: scan until none is new for half a second
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < LATE_QUIET_S and stopper.remaining() > 0.5:
            late = processes.descendants() - stopper.tracked
            if late:
                stopper.tracked |= late
                left |= processes.end(late, grace_s=min(0.5, stopper.remaining()))
                quiet_since = time.monotonic()
            time.sleep(0.05)
        if left:
            eprint(f"[serve] {len(left)} process(es) would not end: "
                   f"{sorted(p for p, _ in left)}")
        if not _wait_port_free(plan, stopper):
            eprint(f"[serve] {plan.host}:{plan.port} still in use")
    eprint(f"[serve] stopped in {stopper.elapsed():.1f} s")
    return clean or not started


def joined_address(args: argparse.Namespace) -> str | None:
    """The cluster this process joins: --address, else $RAY_ADDRESS (set in every KubeRay
    pod); None: it starts a cluster of its own. Only a cluster it started is its to stop."""
    env = os.environ.get("RAY_ADDRESS", "").strip()
    return args.address or (env if env and env != "local" else None)


def run(args: argparse.Namespace) -> int:
    args.address = joined_address(args)
    plan = serve_plan.plan(args)
    summaries = [_snapshot_summary(p, args.matrix) for p in plan.parties]
    owns = args.address is None
    if owns:
        _check_port(plan)
        if not args.skip_resource_check:
            _check_cpus_before_start(plan, args.num_cpus)
    stopper = Stopper()
    stopper.install()
    if owns:
        processes.become_subreaper()
    deployed: list[str] = []
    error: BaseException | None = None
    try:
        cluster = _start(args, plan)
        stopper.install()  # ray.init installed its own SIGTERM handler
        if not owns:
            _check_http(args, cluster)
        _check_names(plan)
        if not args.skip_resource_check:
            _check_resources(plan, owns)
        _deploy(plan, summaries, deployed, owns)
        local.wait_routed([cluster.app_url(p.route_prefix) for p in plan.parties])
        _announce(plan, cluster)
        stopper.wait()  # until a signal raises StopRequested
    except StopRequested:
        pass
    except BaseException as exc:  # noqa: BLE001 - reported after the stop
        error = exc
    clean = _stop(stopper, plan, owns, deployed)
    if not clean or (error is None and not owns):
        # Abandoned: Ray's exit hook would wait on the dead cluster. Joined: the driver's
        # disconnect from someone else's cluster is all that is left, and on a loaded machine
        # Ray's exit hooks alone could take the process past its bound.
        exit_now(report(error, args.debug) if error is not None else 0)
    if error is not None:
        raise error
    return 0
