"""`morphogen chain import`: a node's state dump -> an owner directory, encoded on Ray.

The dump is cut into ranges of lines (`morphogen.chain.dumps.line_ranges`); Ray tasks, at most
`workers` at once, encode, tag and hash each range (`morphogen.chain.bulk.encode_range`) into
arrays in the work directory, which this process reads as soon as they are written (while the
other ranges encode), all but the keys of accounts and storage; it then places the three
tables (`morphogen.chain.bulk.assemble`) while a Ray task builds the owner's key index from
the keys, which this process put in the object store as it read each range (`_index_task`),
and writes the owner directory beside `--out`, renamed into place whole. The tables are those
`chain build` makes from the same state with the same seed.

A killed import leaves its work directory (`<out>.work`): run the same command again and it
reuses every range already encoded (the manifest holds the dump's size and time and the build's
seed; a different dump or options starts over). A malformed line stops it with the line's number
and removes everything it wrote. Progress (records, records/s, time left) goes to the terminal
and to the `morphogen.chain.import` logger (`chain import --log FILE`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from morphogen.chain import bulk, dumps
from morphogen.keyword.descriptor import Anchor
from morphogen.keyword.records import RecordError
from morphogen.storage.durable import fsync_dir

log = logging.getLogger("morphogen.chain.import")
MANIFEST = "manifest.json"
FORMAT = "morphogen-import/1"
RANGE_BYTES = 32 << 20


@dataclass
class Progress:
    total_bytes: int
    done_bytes: int = 0
    records: int = 0
    started: float = 0.0

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        rate = self.records / elapsed
        frac = self.done_bytes / max(self.total_bytes, 1)
        left = elapsed * (1 - frac) / frac if frac > 0 else float("nan")
        return (f"encoded {self.records:,} records ({frac:.0%} of the dump), {rate:,.0f} "
                f"records/s, about {left:,.0f} s left")


def _encode_to(path: str, a: int, b: int, plans: dict, out: str) -> tuple[int, float]:
    """One range as a directory of arrays (`.npy`), written whole and durably (synced, a
    temporary renamed, the directory synced) so that a resumed import trusts it, after a
    power loss too; returns its records and the CPU seconds it took."""
    cpu = time.process_time()
    arrays = bulk.encode_range(path, a, b, plans)
    tmp = Path(out + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)  # a killed task's
    tmp.mkdir()
    for name, array in arrays.items():
        with open(tmp / f"{name}.npy", "wb") as f:
            np.save(f, array)
            f.flush()
            os.fsync(f.fileno())
    fsync_dir(tmp)
    os.replace(tmp, out)
    fsync_dir(Path(out).parent)
    return (len(arrays["acc_keys"]) + len(arrays["sto_keys"]) + len(arrays["code_keys"]),
            time.process_time() - cpu)


def read_range(folder: str | os.PathLike[str], fields) -> dict[str, np.ndarray]:
    """The arrays `fields` of the range a worker wrote at `folder` (`_encode_to`)."""
    return {name: np.load(Path(folder) / f"{name}.npy") for name in fields}


def _index_build(folder: str, capacity: int, parts: list[dict]) -> dict:
    """The owner's key index of the ranges' `parts` (in dump order; `bulk.INDEX_FIELDS` of
    each) written at `folder` and synced: their keys and tags laid out in the export's order
    and checked distinct (the keys by `bulk.key_columns`, the tags by `KeyIndex.build`), for
    a table of `capacity` slots. Returns its
    seconds and CPU seconds (`index_s`, `index_cpu_s`) and, where it can be read, its
    memory's peak above what it held before (`index_peak_mib`)."""
    from morphogen.keyword.key_index import HEAP, KeyIndex, slots_for

    t, cpu = time.monotonic(), time.process_time()
    before = _peak_reset()
    shutil.rmtree(folder, ignore_errors=True)  # a killed import's
    os.makedirs(folder)
    columns = bulk.key_columns(parts, keys_at=Path(folder) / HEAP)
    del parts
    t1 = time.monotonic()
    with KeyIndex.build(folder, columns, slots_for(max(capacity, len(columns)))) as index:
        index.sync(durable=True)
    out = {"index_s": time.monotonic() - t, "index_cpu_s": time.process_time() - cpu,
           "index_order_s": t1 - t}
    if before is not None:
        out["index_peak_mib"] = _status_mib("VmHWM") - before
    return out


def _index_task(folder: str, capacity: int, refs: list) -> dict:
    """`_index_build` as a Ray task, of the parts this process's reads put in the object
    store (on this node, read in place; on another, fetched)."""
    import ray

    t = time.monotonic()
    parts = ray.get(refs)
    return {**_index_build(folder, capacity, parts), "index_get_s": time.monotonic() - t}


def read_ranges(files: list[str], fields) -> list[dict]:
    """`read_range` of each of `files`, in order, each code's records kept in the first range
    that holds it (`bulk.drop_seen_codes`), as the import's own reads keep them."""
    codes: set[bytes] = set()
    parts = []
    for f in files:
        part = read_range(f, fields)
        bulk.drop_seen_codes(part, codes)
        parts.append(part)
    return parts


def _index_to(files: list[str], folder: str, capacity: int) -> dict:
    """`_index_build` of the ranges `files` read here (their reads' seconds: `index_read_s`)."""
    t = time.monotonic()
    parts = read_ranges(files, bulk.INDEX_FIELDS)
    read_s = time.monotonic() - t
    return {**_index_build(folder, capacity, parts), "index_read_s": read_s}


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def _peak_reset() -> float | None:
    """The process's memory high-water mark set to what it holds now (Linux), which this
    returns; None where it cannot be: the index task then reports no peak."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return _status_mib("VmRSS")
    except (OSError, KeyError):
        return None


def _keys_from(files: list[str]):
    """`bulk.assemble`'s `keys_apart`: a table's keys in an order, read from the ranges."""

    def keys(name: str, order: np.ndarray) -> np.ndarray:
        prefix = bulk.PREFIXES[name]
        parts = [read_range(f, (f"{prefix}_keys",)) for f in files]
        return bulk.gathered(parts, f"{prefix}_keys", order, bulk.KEY_SIZES[name])

    return keys


def _capacity(parts: list[dict], room: float, min_records: int) -> int:
    """The slots of the three tables that `bulk.assemble` places `parts` into."""
    from morphogen.chain.tables import TABLES

    return sum(bulk.table_geometry(name, sum(len(p[f"{bulk.PREFIXES[name]}_tags"])
                                             for p in parts),
                                   room=room, min_records=min_records).capacity
               for name in TABLES)


def _manifest(work: Path, dump: Path, ranges: list, seed: int | None) -> dict:
    stat = dump.stat()
    want = {"format": FORMAT, "dump": str(dump.resolve()), "size": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "ranges": ranges}
    path = work / MANIFEST
    if path.is_file():
        have = json.loads(path.read_text())
        if {k: have.get(k) for k in want} == want and (seed is None or have["seed"] == seed):
            return have
        log.info("the work directory %s is of another dump or options: starting over", work)
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    want["seed"] = secrets.randbits(62) if seed is None else seed
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(want))
    os.replace(tmp, path)
    return want


def _ray_encode(workers: int | None, address: str | None):
    """Ray (connected to `address`, else a local instance started), the encoding task and
    the tasks in flight at most."""
    import ray

    from cluster.local import init_local, quiet_ray_logs

    if not ray.is_initialized():
        quiet_ray_logs()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        if address is not None:
            from cluster import ray_access

            ray_access.join_auth()
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=False)
        else:
            os.environ.setdefault("RAY_AUTH_MODE", "disabled")
            # a loaded machine can miss Ray's fixed wait for its node: started again then
            init_local(ray, num_cpus=workers, include_dashboard=False,
                       logging_level=logging.WARNING, log_to_driver=False)
        quiet_ray_logs()
    if workers is None:
        workers = int(ray.cluster_resources().get("CPU", 1))
    return ray, ray.remote(num_cpus=1, max_retries=2)(_encode_to), max(1, workers)


def encode_ranges(dump: Path, work: Path, body: int, *, workers: int | None = None,
                  address: str | None = None, seed: int | None = None,
                  range_bytes: int = RANGE_BYTES, report: Callable[[str], None] = print,
                  timings: dict | None = None,
                  encoded: Callable[[int, str], None] | None = None) -> tuple[list[str], int]:
    """Step 1 on Ray: every range encoded into `work`; returns the range files in dump order
    and the build's seed (`timings["encode_cpu_s"]` gets the tasks' CPU seconds). A malformed
    line raises DumpError naming it. `encoded(i, file)` is called for each range once its
    file is whole (those a killed import left first), while the others are still encoding."""
    timings = {} if timings is None else timings
    timings["encode_cpu_s"] = 0.0
    ranges = dumps.line_ranges(dump, body, range_bytes)
    manifest = _manifest(work, dump, [list(r) for r in ranges], seed)
    plans = bulk.plan(manifest["seed"])
    files = [str(work / f"r{i:06d}") for i in range(len(ranges))]
    todo = [i for i, f in enumerate(files) if not os.path.exists(f)]
    done = encoded or (lambda i, f: None)
    progress = Progress(sum(b - a for a, b in (ranges[i] for i in todo)),
                        started=time.monotonic())
    if len(todo) < len(files):
        report(f"resuming: {len(files) - len(todo)} of {len(files)} ranges already encoded")
        for i in sorted(set(range(len(files))) - set(todo)):
            done(i, files[i])
    if not todo:
        return files, manifest["seed"]
    ray, task, workers = _ray_encode(workers, address)
    progress.started = time.monotonic()  # the rate is the encoding's, not Ray's start
    pending: dict = {}
    queue = list(todo)
    last = 0.0

    def fill() -> None:
        while queue and len(pending) < workers:
            k = queue.pop(0)
            a, b = ranges[k]
            pending[task.remote(str(dump), a, b, plans, files[k])] = k

    try:
        fill()
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            i = pending.pop(ready[0])
            # the freed worker's next range goes out before this one is read in (`done`):
            # workers never wait on the one process's reads
            fill()
            try:
                records, cpu = ray.get(ready[0])
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause
                if isinstance(cause, bulk.RangeError):
                    line = dumps.line_number(dump, ranges[i][0]) + cause.index
                    raise dumps.DumpError(f"{dump.name}:{line}: {cause}") from None
                raise
            progress.records += records
            timings["encode_cpu_s"] += cpu
            done(i, files[i])
            progress.done_bytes += ranges[i][1] - ranges[i][0]
            now = time.monotonic()
            if now - last >= 1.0 or not (queue or pending):
                last = now
                report(progress.line())
                log.info(progress.line())
    finally:
        # the tasks in flight (one range each, about a second) are waited for, not cancelled:
        # a cancel that meets a task's reply on its way aborts this process inside Ray's core
        # worker (a failed check in its task manager, "Tried to complete task that was not
        # pending", Ray 2.60, seen in CI). And the caller removes the work directory (a refused
        # dump's) only once no task is writing in it, or a range written meanwhile would stay
        if pending:
            ray.wait(list(pending), num_returns=len(pending), timeout=60)
    return files, manifest["seed"]


def import_dump(dump: str | os.PathLike[str], out: str | os.PathLike[str], *, signing_key,
                anchor: Anchor, workers: int | None = None, address: str | None = None,
                room: float = 4.0, min_records: int = 4096, seed: int | None = None,
                created: int | None = None, work: str | os.PathLike[str] | None = None,
                range_bytes: int = RANGE_BYTES, body: int | None = None,
                report: Callable[[str], None] = print, timings: dict | None = None) -> Path:
    """The dump (JSON lines: geth's, or anvil's rewritten by `anvil_dump.anvil_lines`) as version 1
    of a new owner directory `out`, anchored at `anchor`; returns its snapshot directory.
    `timings` gets the seconds of each step: encode (with the loads of the ranges it
    finished, `load_s` of it, and their puts for the key index, `index_put_s`), then place,
    the wait for the key index after it (`index_wait_s`; the index task's own `index_s`,
    `index_cpu_s`, `index_peak_mib`) and write."""
    timings = {} if timings is None else timings
    from filelock import FileLock, Timeout

    from morphogen.keyword.owner import create_owner_dir

    dump, out = Path(dump), Path(out)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} is not empty; import into a new directory")
    work = Path(work) if work is not None else out.with_name(out.name + ".work")
    work.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(work) + ".lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        raise FileExistsError(f"another import is writing {work}") from None
    partial = out.with_name(out.name + ".partial")
    staged = work / "pages.staged"
    try:
        if body is None:
            body = dumps.info(dump).body
        t0 = time.monotonic()
        ray, _, _ = _ray_encode(workers, address)
        index_dir = work / "keys"
        loaded: dict[int, dict] = {}
        index_refs: dict[int, object] = {}
        codes: set[bytes] = set()
        timings["load_s"] = timings["index_put_s"] = 0.0

        def load(i: int, folder: str) -> None:
            # read as soon as a worker wrote it (still in the page cache), while the others
            # encode: placing then starts when the last range is in. Into memory, not mapped:
            # mapped ranges are the page cache's to evict, and at 16 M records placing from
            # them ran 1.8x slower than from memory
            t = time.monotonic()
            # not the keys of accounts and storage: only the key index needs them
            part = read_range(folder, bulk.PLACE_FIELDS)
            bulk.drop_seen_codes(part, codes)  # each code's records held once
            loaded[i] = part
            t1 = time.monotonic()
            timings["load_s"] += t1 - t
            # what the key index needs of the range, into the object store now, while the
            # range is in the page cache: read after the encoding, at 16 M records the reads
            # waited on the disk
            index_refs[i] = ray.put(
                {name: part[name] for name in bulk.INDEX_FIELDS if name in part}
                | read_range(folder, (n for n in bulk.INDEX_FIELDS if n not in part)))
            timings["index_put_s"] += time.monotonic() - t1

        indexing = None
        try:
            try:
                files, seed = encode_ranges(dump, work, body, workers=workers, address=address,
                                            seed=seed, range_bytes=range_bytes, report=report,
                                            timings=timings, encoded=load)
            except dumps.DumpError:
                shutil.rmtree(work, ignore_errors=True)  # nothing of a refused dump stays
                raise
            t2, cpu = time.monotonic(), time.process_time()
            parts = [loaded.pop(i) for i in sorted(loaded)]
            # the key index (a third of what one process did after encoding) is built by a
            # Ray task (on a cluster, on a node of its own) while this process places
            refs = [index_refs.pop(i) for i in sorted(index_refs)]
            indexing = ray.remote(num_cpus=1, max_retries=0)(_index_task).remote(
                str(index_dir), _capacity(parts, room, min_records), refs)
            del refs
            table = bulk.assemble(parts, seed=seed, signing_key=signing_key,
                                  anchor=anchor, room=room, min_records=min_records,
                                  created=created, keys_apart=_keys_from(files),
                                  pages_at=staged)
            del parts
            t3 = time.monotonic()
            try:
                timings.update(ray.get(indexing))
            except ray.exceptions.RayTaskError as exc:
                raise exc.cause if isinstance(exc.cause, RecordError) else exc from None
            indexing = None
        except RecordError:  # the dump's fault (an address in two ranges): it stays refused
            shutil.rmtree(work, ignore_errors=True)
            raise
        finally:
            index_refs.clear()
            if indexing is not None:  # this process failed first: the index is not needed
                # (a build stopped while writing leaves files the next one removes). Minutes
                # of work at mainnet size, so cancelled, but not once it is done: a cancel
                # that meets its reply aborts this process (above, `encode_ranges`)
                finished, _ = ray.wait([indexing], timeout=0)
                if not finished:
                    ray.cancel(indexing, force=True)
                    ray.wait([indexing], timeout=60)
        t4 = time.monotonic()
        shutil.rmtree(partial, ignore_errors=True)  # a killed import's
        # the pages placed in their file become the snapshot's, not copied into it
        snapshot = out / create_owner_dir(table, partial, keys_folder=index_dir,
                                          adopt_pages=True).relative_to(partial)
        if out.exists():
            out.rmdir()
        os.replace(partial, out)
        t5 = time.monotonic()
        timings.update(encode_s=t2 - t0, place_s=t3 - t2, index_wait_s=t4 - t3,
                       write_s=t5 - t4, funnel_cpu_s=time.process_time() - cpu)
        records = sum(d.records for d in _parts(table))
        report(f"placed {records:,} records in {t3 - t2:,.1f} s (their key index in "
               f"{t4 - t2:,.1f} s), wrote them in {t5 - t4:,.1f} s")
        log.info("import of %s: %d records into %s", dump.name, records, out)
        shutil.rmtree(work, ignore_errors=True)
    finally:
        # a failed import's pages (the size of the matrix) are not kept for a resume: only
        # the encoded ranges are
        staged.unlink(missing_ok=True)
        lock.release()
        Path(str(work) + ".lock").unlink(missing_ok=True)
    return snapshot


def _parts(table):
    from morphogen.keyword.descriptor import parts_of

    return [p.descriptor for p in parts_of(table.pages)]


def resolve_anchor(info: dumps.DumpInfo, *, chain_id: int | None, block: int | None,
                   block_hash: str | None, rpc: str | None, timeout_s: float = 60.0) -> Anchor:
    """The block the dump is at: from the options, or asked of the node at `rpc` (whose
    state root must then be the one the dump states)."""
    from morphogen.chain import ChainError, EthRpc

    number = block if block is not None else info.number
    if number is None:
        raise ValueError("the dump does not say its block: give --block N (geth's dump is of "
                         "the block it names when run)")
    if info.number is not None and block is not None and block != info.number:
        raise ValueError(f"the dump is at block {info.number}, not --block {block}")
    if rpc is None:
        if chain_id is None or block_hash is None:
            raise ValueError("give --chain-id and --block-hash, or --rpc to ask the node")
        return Anchor(chain_id, number, block_hash.lower())
    try:
        with EthRpc(rpc, timeout_s=timeout_s) as node:
            if chain_id is not None:
                node.check_chain_id(chain_id)
            got = node.chain_id()
            header = node.block(number)
    except ChainError as exc:
        raise ValueError(str(exc)) from None
    if block_hash is not None and header["hash"].lower() != block_hash.lower():
        raise ValueError(f"block {number} at {rpc} is {header['hash']}, not --block-hash "
                         f"{block_hash}")
    if info.root is not None and header["stateRoot"].lower() != info.root:
        raise ValueError(f"the dump's state root {info.root} is not block {number}'s "
                         f"({header['stateRoot']}): a dump of another block or chain")
    return Anchor(got, number, header["hash"].lower())
