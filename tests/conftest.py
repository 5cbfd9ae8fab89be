"""Session-wide set-up shared by every test tier."""

from __future__ import annotations

import numpy as np
import pytest

# pydantic's deprecation warnings, ignored in every test. Added here, not in pyproject's
# filterwarnings: pytest imports a filter's warning class at start-up, and tests/gpu must also
# run where pydantic (and Ray) are not installed.
PYDANTIC_FILTERS = ("PydanticDeprecatedSince20", "PydanticDeprecatedSince211")


def pytest_configure(config: pytest.Config) -> None:
    try:
        import pydantic.warnings
    except ImportError:
        return
    for name in PYDANTIC_FILTERS:
        if hasattr(pydantic.warnings, name):
            config.addinivalue_line("filterwarnings", f"ignore::pydantic.warnings.{name}")


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
