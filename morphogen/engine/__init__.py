"""Scan engines: one contract (`base.py`), several backends giving identical bytes."""

from __future__ import annotations

from typing import Any

from morphogen.engine.base import (
    MAX_KEYS_PER_SCAN,
    PAGE_SIZE,
    Engine,
    EngineUnavailable,
    ShardScanner,
)

ENGINE_NAMES = ("reference", "cpu", "gpu", "auto")

__all__ = [
    "ENGINE_NAMES",
    "MAX_KEYS_PER_SCAN",
    "PAGE_SIZE",
    "Engine",
    "EngineUnavailable",
    "ShardScanner",
    "create",
    "gpu_available",
]


def gpu_available() -> bool:
    """True where CuPy imports and sees at least one CUDA device."""
    try:
        import cupy  # noqa: F401

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no driver, no device: all mean "not here"
        return False


def create(name: str = "auto", **options: Any) -> Engine:
    """The engine called `name`; `auto` is the GPU where one is usable, else the CPU."""
    if name == "auto":
        name = "gpu" if gpu_available() else "cpu"
    if name == "reference":
        from morphogen.engine.reference import ReferenceEngine

        return ReferenceEngine(**options)
    if name == "cpu":
        from morphogen.engine.cpu import CpuEngine

        return CpuEngine(**options)
    if name == "gpu":
        if not gpu_available():
            raise EngineUnavailable("the gpu engine needs CuPy and a visible CUDA device")
        from morphogen.engine.gpu import GpuEngine

        return GpuEngine(**options)
    raise ValueError(f"unknown engine {name!r}; choose one of {', '.join(ENGINE_NAMES)}")
