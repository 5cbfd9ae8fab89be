"""Scan engines: one contract (`base.py`), several backends giving identical bytes.

- `reference`: NumPy, the oracle; `cpu`: numba, a fused DPF-expand and AND-XOR pass (v1 keys)
  or leaf expansion and page XORs into buckets named by the keys' bits (packed keys,
  `_cpu_packed_kernel`); an engine's `key_formats` names the formats it scans
  (`key_formats()`: v1 alone when it names none);
- `gpu`: CuPy over two CUDA kernels, `sliced` (tensor cores over bit-sliced pages, the default)
  and `fused` (integer AND-XOR), each with packed-key kernels: `gpu.py` is the engine,
  `gpu_shard` a shard's pages on the device, scanned and written,
  `gpu_kernels`/`gpu_plan`/`sliced` plan and compile, `gpu_pool` lends the workspaces,
  `gpu_tables` scans tables at any offset, `gpu_writes` writes page updates into the device
  copy, `nvcc_check` holds the kernels to a clean register report in CI.

May use: `morphogen.protocol` (the PRG and DPF keys), `morphogen.constants`, NumPy, numba and
CuPy. Never Ray, pydantic or httpx (the GPU machines lack them; the import contract checks it),
nor the party, client or snapshot packages.
"""

from __future__ import annotations

import logging
from typing import Any

from morphogen.constants import MAX_KEYS_PER_SCAN, PAGE_SIZE
from morphogen.engine.base import Engine, EngineUnavailable, ShardScanner, key_formats

ENGINE_NAMES = ("reference", "cpu", "gpu", "auto")
# About the longest reason `auto` logs when it falls back (an NVRTC log can run to pages).
MAX_REASON_CHARS = 1000

log = logging.getLogger(__name__)

__all__ = [
    "ENGINE_NAMES",
    "MAX_KEYS_PER_SCAN",
    "PAGE_SIZE",
    "Engine",
    "EngineUnavailable",
    "ShardScanner",
    "create",
    "gpu_available",
    "key_formats",
]


def gpu_available() -> bool:
    """True where CuPy imports and sees at least one CUDA device. Cheap: it does not compile
    the kernels, so a CuPy without NVRTC or the CUDA headers passes; creating the gpu engine
    is what tells (see `create`)."""
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "not here"
        return False


def create(name: str = "auto", **options: Any) -> Engine:
    """The engine called `name`; `auto` is the GPU where one is usable, else the CPU.

    The gpu engine compiles its kernels when created, so `gpu` on a machine whose CuPy cannot
    compile raises GpuError naming the cause and the extra to install, and `auto` there logs
    that reason (one warning line) and returns the CPU engine.
    """
    if name == "auto":
        if not gpu_available():
            name = "cpu"
        else:
            from morphogen.engine.gpu_errors import GpuError

            try:
                return _gpu_engine(**options)
            except (EngineUnavailable, GpuError) as exc:
                reason = " ".join(str(exc).split())
                if len(reason) > MAX_REASON_CHARS:  # keep the start (cause) and end (fix)
                    half = MAX_REASON_CHARS // 2
                    reason = f"{reason[:half]} ... {reason[-half:]}"
                log.warning("engine auto: the gpu engine is unusable, using the cpu engine: %s",
                            reason)
                name = "cpu"
    if name == "reference":
        from morphogen.engine.reference import ReferenceEngine

        return ReferenceEngine(**options)
    if name == "cpu":
        from morphogen.engine.cpu import CpuEngine

        return CpuEngine(**options)
    if name == "gpu":
        if not gpu_available():
            raise EngineUnavailable("the gpu engine needs CuPy and a visible CUDA device")
        return _gpu_engine(**options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")


def _gpu_engine(**options: Any) -> Engine:
    from morphogen.engine.gpu import GpuEngine

    return GpuEngine(**options)
