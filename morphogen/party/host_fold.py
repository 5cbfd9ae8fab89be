"""Pending page updates folded into private host copies (the CPU engines' fold).

Every touched chunk becomes a private copy and the untouched runs around it become segments of
their own (views of the loaded pages, no copy); the new version answers the same bytes without
the pending updates. A GPU shard writes its updates into the device copy instead
(morphogen.party.device_fold).
"""

from __future__ import annotations

import numpy as np

from morphogen.engine.base import Engine
from morphogen.party.version import Segment, Version


def fold_on_host(base: Version, engine: Engine, c: int) -> Version:
    """A version with `base`'s answers and no pending updates: each touched chunk of `c`
    pages a private copy (a segment of its own, loaded), the untouched runs around it
    segments of their own (views)."""
    touched: dict[int, np.ndarray] = {}
    for u in base.pending:
        idx = u.page // c
        if idx not in touched:
            lo = max(base.first_page, idx * c)
            hi = min(base.stop_page, (idx + 1) * c)
            touched[idx] = np.stack([base.stored_page(p) for p in range(lo, hi)])
        lo = max(base.first_page, idx * c)
        touched[idx][u.page - lo] ^= np.frombuffer(u.diff, np.uint8)
    kept = []
    for seg in base.segments:
        lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
        if any(lo < (i + 1) * c and i * c < hi for i in touched):
            kept.extend(_split_around(seg, touched, c, engine))
        else:
            kept.append(seg)
    for idx, arr in touched.items():
        lo = max(base.first_page, idx * c)
        # never written again; read-only like the loaded pages, so a jitted engine reuses
        # the kernel it compiled for those instead of compiling another signature
        arr.flags.writeable = False
        kept.append(Segment(lo, arr, engine.load(arr, first_page=lo)))
    kept.sort(key=lambda s: s.first_page)
    return Version(
        identity=base.identity,
        snapshot=base.snapshot,
        first_page=base.first_page,
        stop_page=base.stop_page,
        segments=tuple(kept),
        pending=(),
        folded=base.folded | frozenset(touched),
    )

def _split_around(seg: Segment, touched: dict[int, np.ndarray], c: int,
                  engine: Engine) -> list[Segment]:
    """The parts of `seg` outside the touched chunks, as segments of their own."""
    lo, hi = seg.first_page, seg.first_page + seg.pages.shape[0]
    out, run_start = [], lo
    p = lo
    while p < hi:
        idx = p // c
        chunk_end = min(hi, (idx + 1) * c)
        if idx in touched:
            if run_start < p:
                view = seg.pages[run_start - lo : p - lo]
                out.append(Segment(run_start, view, engine.load(view, run_start)))
            run_start = chunk_end
        p = chunk_end
    if run_start < hi:
        view = seg.pages[run_start - lo : hi - lo]
        out.append(Segment(run_start, view, engine.load(view, run_start)))
    return out
