"""The churn scenario: two parties on a running local Ray Serve while replicas die.

Two parties (2 shards each, 2 router replicas and 2 replicas of every shard, an epoch log and
an admin token each) serve while:
* reader threads fetch random pages all the time with `PirClient` (its default retry policy
  unless told otherwise), checking every page against the model of the epoch its answer names;
* a publisher sends an update batch to A then B every `update_interval_s`, and a snapshot
  rotation every `rotation_interval_s`, each under its own publication id, re-sent to a party
  after an error with the same id (`publish_to_parties`), as an operator re-runs a command;
* every `kill_interval_s` one router or shard replica of either party is SIGKILLed, once the
  deployment it belongs to runs all its replicas again, so that the party keeps serving. Kills
  go in rounds of four (a router and a shard of each party, in a seeded order); a party's router
  kills alternate between a replica serving a publication, stopped at a step by the party's
  one-shot failpoint file, and a replica holding readers' queries.

`run` returns a `ChurnReport`: pages checked and wrong, read errors that reached a reader, the
failures the readers' clients retried, kills, publications and admin re-sends, the longest time
a reader went without a successful read, and the identities both parties serve and have logged
at the end against the last one acknowledged. Used by tests/integration/test_churn.py (a short
seeded run) and bench/churn.py (minutes).
"""

from __future__ import annotations

import hashlib
import os
import random
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import numpy as np

from cluster.local import wait_routed
from morphogen.client import PirClient, RetryPolicy
from morphogen.client.admin import AdminClient, publish_to_parties
from morphogen.snapshot.synthetic import build_synthetic, synthetic_pages

APPS = ("churn-a", "churn-b")
TOKEN = "churn-admin-token-" + "0123456789abcdef" * 2


@dataclass(frozen=True)
class ChurnPlan:
    seed: int = 1
    duration_s: float = 60.0
    kill_interval_s: float = 10.0
    update_interval_s: float = 1.5
    rotation_interval_s: float = 25.0
    readers: int = 2
    pages: int = 200
    # the rotations' targets in turn: page counts (a change of key domain included)
    rotation_pages: tuple[int, ...] = (170, 260)
    retry: RetryPolicy | None = None  # the readers' policy; None: the client's default
    min_kills: int = 0  # go on past duration_s until this many kills were made
    # and until this many publications (rotations among them) were acknowledged, within
    # settle_s: a loaded machine publishes fewer in duration_s, and the checks want them
    min_publications: int = 0
    min_rotations: int = 0
    settle_s: float = 90.0  # how long the end may wait for every replica to be back and at head


class Kill(NamedTuple):
    app: str
    deployment: str  # "router" or "shard_<i>"
    pid: int
    when: str  # "any time", "holding reads" or "at <publication step>"
    at_s: float  # since the scenario started


@dataclass
class ChurnReport:
    pages_checked: int = 0
    wrong_pages: list[str] = field(default_factory=list)
    read_errors: list[str] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    # what the readers' clients met and retried: HTTP statuses and transport errors, by name
    absorbed: dict[str, int] = field(default_factory=dict)
    publications: int = 0
    rotations: int = 0
    admin_resends: int = 0
    admin_failures: list[str] = field(default_factory=list)
    resent: list[str] = field(default_factory=list)  # the publications re-sent, when and how long
    longest_outage_s: float = 0.0
    longest_outage_from_s: float = 0.0  # when it began, since the scenario started
    longest_outage_trace: list[str] = field(default_factory=list)  # its reader's requests
    # what the readers asked of party A: queries (each a scan of every page) and /epoch reads
    queries_a: int = 0
    epoch_reads_a: int = 0
    last_acknowledged: tuple[int, str | None] | None = None
    served: tuple[Any, ...] = ()  # (epoch id, identity) that GET /epoch of A and B name at the end
    log_heads: tuple[Any, ...] = ()  # the identities of A's and B's epoch log heads at the end
    replicas_at_head: bool = False
    elapsed_s: float = 0.0

    @property
    def parties_agree(self) -> bool:
        """Both parties serve, and have logged as head, the last acknowledged publication."""
        if self.last_acknowledged is None or len(self.served) != 2:
            return False
        want = self.last_acknowledged
        return all(tuple(s) == want for s in self.served) and \
            all(h == want[1] for h in self.log_heads)

    def summary(self, verbose: bool = True) -> str:
        routers = sum(k.deployment == "router" for k in self.kills)
        at_step = sum(k.when.startswith("at ") for k in self.kills)
        holding = sum(k.when == "holding reads" for k in self.kills)
        absorbed = ", ".join(f"{n} x {k}" for k, n in sorted(self.absorbed.items())) or "none"
        lines = [
            f"churn: {self.elapsed_s:.0f} s, {self.pages_checked} pages checked, "
            f"{len(self.wrong_pages)} wrong, {len(self.read_errors)} read errors",
            f"kills: {len(self.kills)} ({routers} routers: {at_step} mid-publication, {holding} "
            f"holding reads; {len(self.kills) - routers} shards)",
            f"failures the readers' clients retried: {absorbed}",
            f"publications: {self.publications} acknowledged ({self.rotations} rotations), "
            f"{self.admin_resends} admin re-sends, {len(self.admin_failures)} failed",
            f"longest read outage: {self.longest_outage_s:.2f} s (from "
            f"{self.longest_outage_from_s:.1f} s on); the readers asked A {self.queries_a} "
            f"queries and {self.epoch_reads_a} /epoch reads",
            f"parties at the end: A {self._view(0)}, B {self._view(1)}; last acknowledged "
            f"{self.last_acknowledged}; one identity: {'yes' if self.parties_agree else 'NO'}; "
            f"every replica at the log head: {'yes' if self.replicas_at_head else 'NO'}",
        ]
        if verbose:
            lines += [f"  {x}" for x in self.resent]
            lines += [f"  {k.at_s:6.1f} s: killed {k.app} {k.deployment} (pid {k.pid}, {k.when})"
                      for k in self.kills]
            lines += ["the longest outage's requests:"]
            lines += [f"  {x}" for x in self.longest_outage_trace]
        for what, items in (("read error", self.read_errors), ("wrong page", self.wrong_pages),
                            ("admin failure", self.admin_failures)):
            lines += [f"  {what}: {x}" for x in items[:5]]
        return "\n".join(lines)

    def _view(self, i: int) -> str:
        return str(tuple(self.served[i])) if len(self.served) > i else "?"


def _digest(page: bytes) -> bytes:
    return hashlib.blake2b(page, digest_size=16).digest()


class Models:
    """Per epoch id, the digest of every page the parties must serve under it (recorded
    before the publication is sent: a reader may see it as soon as one party commits)."""

    def __init__(self, epoch: int, pages: np.ndarray) -> None:
        self.current = pages.copy()
        self.epoch = epoch
        self._lock = threading.Lock()
        self._digests: dict[int, list[bytes]] = {epoch: [_digest(p.tobytes()) for p in pages]}

    def next_updates(self, changes: list[tuple[int, str, bytes]]) -> int:
        digests = list(self._digests[self.epoch])
        for page, kind, raw in changes:
            data = np.zeros(4096, np.uint8)
            data[: len(raw)] = np.frombuffer(raw, np.uint8)
            self.current[page] = self.current[page] ^ data if kind == "diff" else data
            digests[page] = _digest(self.current[page].tobytes())
        return self._record(digests)

    def next_snapshot(self, pages: np.ndarray) -> int:
        self.current = pages.copy()
        return self._record([_digest(p.tobytes()) for p in pages])

    def _record(self, digests: list[bytes]) -> int:
        with self._lock:
            self.epoch += 1
            self._digests[self.epoch] = digests
        return self.epoch

    def check(self, epoch: int, wanted: list[int], pages: list[bytes]) -> str | None:
        with self._lock:
            digests = self._digests.get(epoch)
        if digests is None:
            return f"an answer from epoch {epoch}, which no publication made"
        for p, page in zip(wanted, pages, strict=True):
            if p >= len(digests) or digests[p] != _digest(page):
                return f"page {p} of epoch {epoch} differs from the model"
        return None


def random_changes(rng: random.Random, num_pages: int) -> list[tuple[int, str, bytes]]:
    """1..4 page updates: XOR diffs and replacements of 1, 100 or 4096 bytes."""
    out = []
    for _ in range(rng.randint(1, 4)):
        page = rng.randrange(num_pages)
        if rng.random() < 0.6:
            out.append((page, "diff", rng.randbytes(4096)))
        else:
            out.append((page, "data", rng.randbytes(rng.choice([1, 100, 4096]))))
    return out


class _Counting(httpx.HTTPTransport):
    """The readers' transport: counts every answer that is not a 200 and every transport
    error (what the client retried, unless it reached the reader). `keep_alive` False opens a
    connection per request, as short-lived clients do: a replica's death then reaches the
    client as Serve's HTTP 500 rather than as a dropped connection."""

    def __init__(self, counts: dict[str, int], lock: threading.Lock, started: float,
                 keep_alive: bool = True) -> None:
        super().__init__(limits=httpx.Limits(max_connections=100,
                                             max_keepalive_connections=20 if keep_alive else 0))
        self.counts, self.lock, self.started = counts, lock, started
        # every request of this reader: (sent, answered, its path, status or error), seconds
        # since the scenario started; the longest outage is explained from these
        self.trace: list[tuple[float, float, str, str]] = []

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.monotonic() - self.started
        try:
            resp = super().handle_request(request)
        except httpx.TransportError as exc:
            self._count(type(exc).__name__)
            self._trace(sent, request, type(exc).__name__)
            raise
        if resp.status_code != 200:
            self._count(f"HTTP {resp.status_code}")
        self._trace(sent, request, str(resp.status_code))
        return resp

    def _trace(self, sent: float, request: httpx.Request, outcome: str) -> None:
        self.trace.append((sent, time.monotonic() - self.started, request.url.path, outcome))


class _Readers:
    def __init__(self, urls: tuple[str, str], models: Models, plan: ChurnPlan,
                 max_page: int, started: float) -> None:
        self.urls, self.models, self.plan, self.max_page = urls, models, plan, max_page
        self.started = started
        self.longest_from = 0.0
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.absorbed: dict[str, int] = {}
        self.checked = 0
        self.wrong: list[str] = []
        self.errors: list[str] = []
        self.longest = 0.0
        self.longest_trace: list[str] = []  # the requests of the longest outage's reader in it
        self.transports: list[_Counting] = []
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True)
                        for i in range(plan.readers)]

    def _run(self, i: int) -> None:
        rng = random.Random(self.plan.seed * 1000 + i)
        last_ok = time.monotonic()
        kwargs = {} if self.plan.retry is None else {"retry": self.plan.retry}
        transport = _Counting(self.absorbed, self.lock, self.started, keep_alive=i % 2 == 0)
        with self.lock:
            self.transports.append(transport)
        with PirClient(*self.urls, timeout_s=30, transport=transport, **kwargs) as client:
            while not self.stop.is_set():
                wanted = [rng.randrange(self.max_page) for _ in range(rng.randint(1, 3))]
                try:
                    epoch, pages = client.get_with_epoch(wanted)
                except Exception as exc:  # noqa: BLE001 - what reached the reader is counted
                    with self.lock:
                        self.errors.append(f"{type(exc).__name__}: {exc}")
                    time.sleep(0.1)
                    continue
                now = time.monotonic()
                bad = self.models.check(epoch, wanted, pages)
                with self.lock:
                    self._outage(last_ok, now, transport)
                    self.checked += len(pages)
                    if bad:
                        self.wrong.append(bad)
                last_ok = now
        with self.lock:
            self._outage(last_ok, time.monotonic(), transport)

    def _outage(self, last_ok: float, now: float, transport: _Counting) -> None:
        if now - last_ok > self.longest:
            self.longest, self.longest_from = now - last_ok, last_ok - self.started
            began, ended = last_ok - self.started, now - self.started
            self.longest_trace = [f"{a:6.2f} -> {b:6.2f} s: {path} {outcome}"
                                  for a, b, path, outcome in transport.trace
                                  if b >= began and a <= ended]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def join(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(120)


class _Publisher:
    """Updates to A then B every `update_interval_s`, a rotation every `rotation_interval_s`;
    each publication re-sent to a party after an error under the same id."""

    def __init__(self, urls: tuple[str, str], models: Models, plan: ChurnPlan,
                 rotations: list[tuple[str, np.ndarray]], report: ChurnReport,
                 started: float) -> None:
        self.urls, self.models, self.plan, self.started = urls, models, plan, started
        self.rotations, self.report = rotations, report
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _publish(self, pub: str, expected: int, send: Callable[[AdminClient], dict],
                 admins: list[AdminClient], rotation: bool = False) -> None:
        def counted(client: AdminClient) -> dict:
            sends[client.url] = sends.get(client.url, 0) + 1
            try:
                return send(client)
            except Exception as exc:
                party = "AB"[self.urls.index(client.url)]
                status = getattr(exc, "status", None)
                errors.append(f"{party}: {type(exc).__name__}"
                              + (f" {status}" if status is not None else ""))
                raise

        sends: dict[str, int] = {}
        errors: list[str] = []
        began = time.monotonic()
        try:
            out = publish_to_parties(admins, counted, retry_for_s=120.0)
        except Exception as exc:  # noqa: BLE001 - counted: the test asserts there is none
            self.report.admin_failures.append(f"{pub}: {type(exc).__name__}: {exc}")
            return
        finally:
            resends = sum(n - 1 for n in sends.values())
            self.report.admin_resends += resends
            if resends:
                self.report.resent.append(
                    f"{began - self.started:6.1f} s: {pub} re-sent {resends} time(s) after "
                    f"{', '.join(errors)}; done in {time.monotonic() - began:.1f} s")
        epochs = {r["epoch_id"] for r in out}
        if epochs != {expected}:
            self.report.admin_failures.append(
                f"{pub}: answered as epoch(s) {sorted(epochs)}, expected {expected}")
            return
        self.report.publications += 1
        self.report.rotations += rotation
        self.report.last_acknowledged = (expected, out[0].get("identity"))

    def _run(self) -> None:
        rng = random.Random(self.plan.seed)
        started = time.monotonic()
        rotated = 0
        n = 0
        # a connection per request, as `morphogen admin` commands (one process each) make
        fresh = httpx.Limits(max_keepalive_connections=0)
        with AdminClient(self.urls[0], TOKEN, timeout_s=60,
                         transport=httpx.HTTPTransport(limits=fresh)) as adm_a, \
                AdminClient(self.urls[1], TOKEN, timeout_s=60,
                            transport=httpx.HTTPTransport(limits=fresh)) as adm_b:
            admins = [adm_a, adm_b]
            while not self.stop.wait(self.plan.update_interval_s):
                n += 1
                if time.monotonic() - started >= (rotated + 1) * self.plan.rotation_interval_s:
                    name, pages = self.rotations[rotated % len(self.rotations)]
                    rotated += 1
                    pub = f"churn-{self.plan.seed}-rotation-{rotated}"
                    expected = self.models.next_snapshot(pages)
                    self._publish(pub, expected, lambda c, s=name, p=pub: c.snapshot(s, p),
                                  admins, rotation=True)
                    continue
                changes = random_changes(rng, self.models.current.shape[0])
                pub = f"churn-{self.plan.seed}-updates-{n}"
                expected = self.models.next_updates(changes)
                self._publish(pub, expected, lambda c, x=changes, p=pub: c.updates(x, p),
                              admins)

    def start(self) -> None:
        self.thread.start()

    def join(self) -> None:
        self.stop.set()
        self.thread.join(300)


def _running(app: str, deployment: str) -> int:
    from ray import serve

    try:
        states = serve.status().applications[app].deployments[deployment].replica_states
    except KeyError:
        return 0
    return int(states.get("RUNNING", 0)) if len(states) == 1 else -1


def wait_until(predicate: Callable[[], bool], timeout_s: float,
               interval_s: float = 0.25) -> bool:
    """Whether `predicate` came true (an exception counts as not yet) within `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - not yet
            pass
        time.sleep(interval_s)
    return False


class _Killer:
    """SIGKILLs one replica at a time, each once its deployment runs all its replicas again.
    A party's router kills alternate between the moment a router replica serves a publication,
    stopped at a step by the party's one-shot failpoint file (after the proposal, after every
    prepare, after the decision: the admin meets the error and re-sends the same id), and a
    moment it holds reads (the readers' requests in flight there fail under them)."""

    STEPS = ("proposed", "prepared", "decided")

    def __init__(self, root: Path, seed: int, replicas: int = 2, num_shards: int = 2) -> None:
        self.root, self.replicas, self.num_shards = root, replicas, num_shards
        self.rng = random.Random(seed)
        self.router_kills = dict.fromkeys(APPS, 0)
        self._plan = self._targets()

    @staticmethod
    def failpoint(root: Path, app: str) -> Path:
        return root / f"failpoint-{app}"

    def _targets(self):
        """Rounds of four: a router, a shard, a router, a shard, one of each party each, in a
        seeded order."""
        while True:
            routers = [(app, "router") for app in APPS]
            shards = [(app, f"shard_{self.rng.randrange(self.num_shards)}") for app in APPS]
            self.rng.shuffle(routers)
            self.rng.shuffle(shards)
            yield from (routers[0], shards[0], routers[1], shards[1])

    def kill_next(self, started: float) -> Kill:
        from ray import serve

        app, deployment = next(self._plan)
        if not wait_until(lambda: _running(app, deployment) == self.replicas, 90, 0.2):
            raise RuntimeError(f"{app}/{deployment} did not get back to {self.replicas} replicas")
        handle = serve.get_deployment_handle(deployment, app_name=app)
        pid, when = None, "any time"
        if deployment == "router":
            n = self.router_kills[app]
            self.router_kills[app] += 1
            if n % 2 == 0:
                step = self.STEPS[(n // 2 + APPS.index(app)) % len(self.STEPS)]
                pid = self._stopped_publisher(app, step)
                when = f"at {step}" if pid is not None else when
            else:
                pid = self._holding_reads(handle)
                when = "holding reads" if pid is not None else when
        if pid is None:
            method = handle.stats if deployment == "router" else handle.info
            pid = int(method.remote().result(timeout_s=30)["pid"])
        os.kill(pid, signal.SIGKILL)
        at_s = time.monotonic() - started
        wait_until(lambda: _running(app, deployment) != self.replicas, 10, 0.1)
        return Kill(app, deployment, pid, when, at_s)

    @staticmethod
    def _holding_reads(handle: Any, timeout_s: float = 20.0, probes: int = 4) -> int | None:
        """The pid of a router replica that holds readers' queries right now (None if none was
        found in time). The probes go out together: Serve routes a lone call to the replica
        with the fewest requests in flight, which is the one holding no reads."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            calls = [handle.stats.remote() for _ in range(probes)]
            for stats in (call.result(timeout_s=30) for call in calls):
                if stats.get("held_queries", 0) > 0:
                    return int(stats["pid"])
        return None

    def _stopped_publisher(self, app: str, step: str, timeout_s: float = 30.0) -> int | None:
        """Arm `app`'s failpoint at `step`; the pid of the router replica that stopped there
        (None if no publication reached it in time: then the failpoint is disarmed)."""
        armed = self.failpoint(self.root, app)
        fired = Path(str(armed) + ".fired")
        armed.write_text(step)
        if not wait_until(fired.exists, timeout_s, 0.05):
            armed.unlink(missing_ok=True)
            if not wait_until(fired.exists, 1.0, 0.05):  # a publisher may have taken it meanwhile
                return None
        wait_until(lambda: fired.read_text().strip().isdigit(), 5.0, 0.02)
        pid = int(fired.read_text())
        fired.unlink()
        return pid


def _party_args(common: dict[str, Any], root: Path, name: str) -> dict[str, Any]:
    return {
        **common,
        "snapshot": str(root / "snaps" / "base"),
        "num_shards": 2,
        "shard_replicas": 2,
        "router_replicas": 2,
        "admin_token_file": str(root / "token"),
        "admin_snapshot_dir": str(root / "snaps"),
        "epoch_log_dir": str(root / f"log-{name}"),
        "admin_failpoint_file": str(_Killer.failpoint(root, name)),
    }


def run(base_url: str, root: Path, plan: ChurnPlan, common: dict[str, Any]) -> ChurnReport:
    """Deploy the two parties on the running Serve (`common`: party arguments both share),
    run the scenario for `plan.duration_s`, delete the parties, return what was seen."""
    from ray import serve

    root.mkdir(parents=True, exist_ok=True)
    snaps = root / "snaps"
    build_synthetic(snaps / "base", plan.pages, seed=plan.seed, epoch_id=1, progress=False)
    rotations = []
    for i, count in enumerate(plan.rotation_pages):
        seed = plan.seed + 1 + i
        build_synthetic(snaps / f"rot{i}", count, seed=seed, epoch_id=1, progress=False)
        rotations.append((f"rot{i}", synthetic_pages(seed, 0, count)))
    (root / "token").write_text(TOKEN)
    try:
        return _run(base_url, root, plan, common, rotations)
    finally:
        for app in APPS:
            try:
                serve.delete(app)
            except Exception:  # noqa: BLE001 - never deployed
                pass


def _run(base_url: str, root: Path, plan: ChurnPlan, common: dict[str, Any],
         rotations: list[tuple[str, np.ndarray]]) -> ChurnReport:
    from ray import serve

    from deployments.app import build_app

    for app in APPS:
        serve.run(build_app(_party_args(common, root, app)), name=app, route_prefix=f"/{app}")
    urls = (f"{base_url}/{APPS[0]}", f"{base_url}/{APPS[1]}")
    wait_routed(list(urls))
    report = ChurnReport()
    models = Models(1, synthetic_pages(plan.seed, 0, plan.pages))
    started = time.monotonic()
    readers = _Readers(urls, models, plan, min(plan.pages, *plan.rotation_pages), started)
    publisher = _Publisher(urls, models, plan, rotations, report, started)
    killer = _Killer(root, plan.seed)
    try:
        readers.start()
        publisher.start()
        next_kill = started + plan.kill_interval_s
        while next_kill <= started + plan.duration_s or len(report.kills) < plan.min_kills:
            time.sleep(max(0.0, next_kill - time.monotonic()))
            report.kills.append(killer.kill_next(started))
            next_kill = max(next_kill + plan.kill_interval_s, time.monotonic())
        time.sleep(max(0.0, started + plan.duration_s - time.monotonic()))
        wait_until(lambda: report.publications >= plan.min_publications
                   and report.rotations >= plan.min_rotations, plan.settle_s, 0.2)
        publisher.join()
        # the readers go on while the last replicas come back and reach the head
        report.replicas_at_head = wait_until(lambda: _all_at_head(urls), plan.settle_s, 0.5)
        time.sleep(1.0)
    finally:
        publisher.join()
        readers.join()
        report.elapsed_s = time.monotonic() - started
    report.pages_checked = readers.checked
    report.wrong_pages = readers.wrong
    report.read_errors = readers.errors
    report.longest_outage_s = readers.longest
    report.longest_outage_from_s = readers.longest_from
    report.longest_outage_trace = readers.longest_trace
    paths = [path for t in readers.transports for _, _, path, _ in t.trace
             if path.startswith(f"/{APPS[0]}/")]
    report.queries_a = sum("/query/" in path for path in paths)
    report.epoch_reads_a = sum(path.endswith("/epoch") for path in paths)
    report.absorbed = dict(readers.absorbed)
    report.served = tuple(_served(u) for u in urls)
    heads = []
    for url in urls:
        with AdminClient(url, TOKEN, timeout_s=30) as adm:
            heads.append((adm.status().get("epoch_log_head") or {}).get("identity"))
    report.log_heads = tuple(heads)
    return report


def _served(url: str) -> tuple[int, str | None]:
    doc = httpx.get(url + "/epoch", timeout=30).json()
    return int(doc["epoch_id"]), doc.get("identity")


def _all_at_head(urls: tuple[str, str]) -> bool:
    """Every router and shard replica of both parties runs, and every shard replica serves its
    party's log head."""
    for app in APPS:
        if any(_running(app, d) != 2 for d in ("router", "shard_0", "shard_1")):
            return False
    for url in urls:
        with AdminClient(url, TOKEN, timeout_s=30) as adm:
            status = adm.status()
        head = (status.get("epoch_log_head") or {}).get("identity")
        if status.get("epoch_log_pending") is not None:
            return False
        for shard in status["shards"]:
            if len(shard["replicas"]) != 2 or {r["identity"] for r in shard["replicas"]} != {head}:
                return False
    return True
