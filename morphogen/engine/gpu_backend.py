"""What the GPU engine needs from CUDA (`Backend`), and that protocol on CuPy (`CupyBackend`).

Everything that touches CUDA goes through this small protocol, so the workspace pool, the
launches and the packing are tested on machines without a GPU against a fake backend
(tests/unit/_gpu_fakes.py). CuPy is imported when a CupyBackend is created, not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from morphogen.engine.base import EngineUnavailable


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    sm_count: int
    total_memory: int


class Backend(Protocol):
    """What the engine needs from CUDA. Device buffers are opaque; host buffers are numpy."""

    error_types: tuple[type[BaseException], ...]

    def device_info(self) -> DeviceInfo: ...

    def free_memory(self) -> int: ...

    def activate(self) -> contextlib.AbstractContextManager[Any]: ...

    def compile(self, source: str, options: Sequence[str], names: Sequence[str]) -> Mapping[
        str, Any
    ]: ...

    def blocks_per_sm(self, kernel: Any, block: int, smem_bytes: int) -> int: ...

    def set_max_dynamic_smem(self, kernel: Any, nbytes: int) -> None: ...

    def view(self, buf: Any, offset: int) -> Any: ...

    def alloc(self, nbytes: int) -> Any: ...

    def alloc_pinned(self, nbytes: int) -> np.ndarray: ...

    def new_stream(self) -> Any: ...

    def new_event(self) -> Any: ...

    def h2d(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None: ...

    def d2h(self, dst: np.ndarray, src: Any, src_offset: int, stream: Any) -> None: ...

    def launch(
        self, kernel: Any, grid: int, block: int, args: tuple[Any, ...], smem_bytes: int,
        stream: Any,
    ) -> None: ...

    def record(self, event: Any, stream: Any) -> None: ...

    def event_synchronize(self, event: Any) -> None: ...

    def synchronize(self, stream: Any) -> None: ...

    def elapsed_ms(self, start: Any, end: Any) -> float: ...


class CupyBackend:
    """The Backend on CuPy: plain cudaMalloc allocations, NVRTC-compiled RawModule."""

    def __init__(self, device: int) -> None:
        try:
            import cupy
        except Exception as exc:  # ImportError, or a CuPy that cannot find its CUDA libraries
            raise EngineUnavailable(f"the gpu engine needs CuPy: {exc}") from exc
        self._cp = cupy
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            raise EngineUnavailable(f"no CUDA device is usable: {exc}") from exc
        if not 0 <= device < count:
            raise EngineUnavailable(f"CUDA device {device} requested, {count} present")
        self._device = device
        self.error_types = (
            cupy.cuda.runtime.CUDARuntimeError,
            cupy.cuda.driver.CUDADriverError,
            cupy.cuda.compiler.CompileException,
            cupy.cuda.memory.OutOfMemoryError,
        )

    def device_info(self) -> DeviceInfo:
        props = self._cp.cuda.runtime.getDeviceProperties(self._device)
        name = props["name"]
        return DeviceInfo(
            name=name.decode() if isinstance(name, bytes) else str(name),
            sm_count=int(props["multiProcessorCount"]),
            total_memory=int(props["totalGlobalMem"]),
        )

    def free_memory(self) -> int:
        with self.activate():
            return int(self._cp.cuda.runtime.memGetInfo()[0])

    def activate(self) -> contextlib.AbstractContextManager[Any]:
        return self._cp.cuda.Device(self._device)

    def compile(self, source: str, options: Sequence[str], names: Sequence[str]) -> dict[str, Any]:
        with self.activate():
            module = self._cp.RawModule(code=source, options=tuple(options), backend="nvrtc")
            kernels = {name: module.get_function(name) for name in names}
            for k in kernels.values():
                _ = k.kernel  # compiles the module (once) and loads each function now
            return kernels

    def blocks_per_sm(self, kernel: Any, block: int, smem_bytes: int) -> int:
        with self.activate():
            return int(
                self._cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
                    kernel.kernel.ptr, block, smem_bytes
                )
            )

    def set_max_dynamic_smem(self, kernel: Any, nbytes: int) -> None:
        # above 48 KiB a kernel must opt in (cudaFuncAttributeMaxDynamicSharedMemorySize)
        with self.activate():
            kernel.max_dynamic_shared_size_bytes = int(nbytes)

    def view(self, buf: Any, offset: int) -> Any:
        return buf[int(offset) :]

    def alloc(self, nbytes: int) -> Any:
        cp = self._cp
        with self.activate():
            # a plain cudaMalloc, outside CuPy's pool: the pages are one long-lived block and
            # must go back to the driver when the shard closes
            mem = cp.cuda.Memory(max(int(nbytes), 16))
            return cp.ndarray((max(int(nbytes), 16),), cp.uint8, cp.cuda.MemoryPointer(mem, 0))

    def alloc_pinned(self, nbytes: int) -> np.ndarray:
        mem = self._cp.cuda.alloc_pinned_memory(max(int(nbytes), 16))
        return np.frombuffer(mem, np.uint8, max(int(nbytes), 16))

    def new_stream(self) -> Any:
        with self.activate():
            return self._cp.cuda.Stream(non_blocking=True)

    def new_event(self) -> Any:
        with self.activate():
            return self._cp.cuda.Event()

    def h2d(self, dst: Any, dst_offset: int, src: np.ndarray, stream: Any) -> None:
        rt = self._cp.cuda.runtime
        rt.memcpyAsync(
            dst.data.ptr + dst_offset, src.ctypes.data, src.nbytes, rt.memcpyHostToDevice,
            stream.ptr,
        )

    def d2h(self, dst: np.ndarray, src: Any, src_offset: int, stream: Any) -> None:
        rt = self._cp.cuda.runtime
        rt.memcpyAsync(
            dst.ctypes.data, src.data.ptr + src_offset, dst.nbytes, rt.memcpyDeviceToHost,
            stream.ptr,
        )

    def launch(
        self, kernel: Any, grid: int, block: int, args: tuple[Any, ...], smem_bytes: int,
        stream: Any,
    ) -> None:
        with stream:
            kernel((grid,), (block,), args, shared_mem=smem_bytes)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def event_synchronize(self, event: Any) -> None:
        event.synchronize()

    def synchronize(self, stream: Any) -> None:
        stream.synchronize()

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(self._cp.cuda.get_elapsed_time(start, end))
