"""Where a GPU scan call's time went (`GpuShard.scan_timed`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseTimings:
    """Where one scan call's time went, summed over its launches (a call of more than max_keys
    keys runs several, one after another on the same workspace).

    The device phases are CUDA-event times on the workspace's stream (`GpuShard._launch`):
    e0, key copy, e1, scan and reduce, e2, answer copy, e3. Events on one stream time that
    stream's timeline, not its work alone: a phase also holds any time its work waited for the
    device. kernel_ms (e1 -> e2) starts once the keys are on the device and ends when the reduce
    has finished. A scan grid fills every SM, so while another workspace's kernels run, this
    launch's scan waits for them, and that wait is inside kernel_ms: events cannot tell the two
    apart (the kernel's start is not observable on the stream). `shared_launches` says which
    number to trust: it counts the launches that had another scan of the same shard holding a
    workspace at some moment while they ran. With 0, kernel_ms is the kernels' own time (plus
    the few microseconds the host takes to submit the two launches); otherwise it is an upper
    bound that may include queueing. h2d_ms and d2h_ms may likewise include waiting for a copy
    engine busy with another workspace's copy.
    """

    h2d_ms: float
    kernel_ms: float
    d2h_ms: float
    wait_ms: float  # host time the call waited for a free workspace
    total_ms: float  # host wall time of the call
    launches: int
    shared_launches: int = 0  # launches that overlapped another scan: see above
    # writes applied to the device copy before the scan (GpuShard.write_pages): the data the
    # answers are on; every launch of the call reads the same
    generation: int = 0
