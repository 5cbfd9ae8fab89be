"""Session-wide set-up shared by every test tier."""

from __future__ import annotations

import numpy as np
import pytest


@pytest.fixture(scope="session", autouse=True)
def compiled_cpu_kernels() -> None:
    """Compile (or load from numba's on-disk cache) the jitted kernels once, up front.

    Servers started by the tests in other processes then find them cached instead of each
    compiling them cold at once, which on a fresh 2-core machine can take minutes.
    """
    from morphogen import dpf, engine

    keys = dpf.generate_keys(4, 3)
    dpf.eval_range(keys[0], 0, 16)
    dpf.eval_points(list(keys), np.arange(4))
    engine.create("cpu").load(np.zeros((16, 4096), np.uint8)).scan(list(keys))
