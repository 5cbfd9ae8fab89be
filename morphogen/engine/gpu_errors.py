"""The GPU engine's one error type, and the translation of backend failures into it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from morphogen.engine.gpu_backend import Backend


class GpuError(RuntimeError):
    """A CUDA, NVRTC or device-memory failure, with the driver's message."""


# The fix for kernels that do not compile: the CuPy wheel for the driver's CUDA major version
# with its [ctk] extra, the toolkit wheels that RawModule needs (pyproject's gpu-cuda* extras).
TOOLKIT_HINT = (
    "install the CuPy that matches the driver (the CUDA Version nvidia-smi prints) with the CUDA "
    "toolkit wheels: pip install 'morphogen[gpu-cuda12]' for 12.x or 'morphogen[gpu-cuda13]' "
    "for 13.x, after pip uninstall of any other cupy-cuda* wheel; or set CUDA_PATH to a local "
    "CUDA toolkit"
)


@contextlib.contextmanager
def cuda_errors(backend: Backend, doing: str) -> Iterator[None]:
    """Backend (CUDA, NVRTC, out-of-memory) exceptions become GpuError naming the step."""
    try:
        yield
    except GpuError:
        raise
    except backend.error_types as exc:
        raise GpuError(f"CUDA failure while {doing}: {exc}") from exc


def one_line(exc: BaseException) -> str:
    """The exception's message with its whitespace (NVRTC logs run over lines) collapsed."""
    return " ".join(str(exc).split())
