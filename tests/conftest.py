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


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The multi-node scenario first. It runs a Ray cluster of several nodes of its own and
    needs this machine's cores while its load steps are timed; run after the integration
    modules, it shares them with this session's Ray instance and every party still deployed
    there (on 2 cores its shards then missed the scale-up it waits for)."""
    first = [i for i in items if "tests/multinode/" in i.nodeid.replace("\\", "/")
             or i.nodeid.startswith("multinode/")]
    if first:
        moved = set(first)
        items[:] = first + [i for i in items if i not in moved]


@pytest.fixture(scope="session", autouse=True)
def compiled_cpu_kernels() -> None:
    """Compile (or load from numba's on-disk cache) the jitted kernels once, up front.

    Servers started by the tests in other processes then find them cached instead of each
    compiling them cold at once, which on a fresh 2-core machine can take minutes.
    """
    from morphogen import engine
    from morphogen.protocol import dpf

    keys = dpf.generate_keys(4, 3)
    dpf.eval_range(keys[0], 0, 16)
    dpf.eval_points(list(keys), np.arange(4))
    engine.create("cpu").load(np.zeros((16, 4096), np.uint8)).scan(list(keys))


@pytest.fixture(scope="session")
def s3_server():
    """One S3 protocol server on 127.0.0.1 for the whole test session."""
    from tests.s3.server import running_s3_server

    with running_s3_server() as server:
        yield server


@pytest.fixture
def s3_env(s3_server, monkeypatch: pytest.MonkeyPatch):
    """This process's environment pointed at the loopback S3 server; returns the server."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def s3_bucket(s3_env) -> str:
    """A fresh, empty bucket on the loopback S3 server (the environment points at it)."""
    return s3_env.new_bucket()
