"""Session-wide set-up shared by every test tier."""

from __future__ import annotations

import os

import numpy as np
import pytest

# pydantic's deprecation warnings, ignored in every test. Added here, not in pyproject's
# filterwarnings: pytest imports a filter's warning class at start-up, and tests/gpu must also
# run where pydantic (and Ray) are not installed.
PYDANTIC_FILTERS = ("PydanticDeprecatedSince20", "PydanticDeprecatedSince211")


def pytest_configure(config: pytest.Config) -> None:
    _spread_the_whole_suite(config)
    try:
        import pydantic.warnings
    except ImportError:
        return
    for name in PYDANTIC_FILTERS:
        if hasattr(pydantic.warnings, name):
            config.addinivalue_line("filterwarnings", f"ignore::pydantic.warnings.{name}")


# Worker processes for the whole suite. Most of its time is spent waiting (on Ray replicas
# starting, a cluster scaling, a store timing out), not computing, so three workers on two
# cores overlap those waits: the suite's one shared Ray instance on one worker, the tests that
# start clusters of their own on another, the unit tier spread over all three.
SUITE_WORKERS = 3
# Integration modules whose tests start clusters of their own, as `morphogen` processes, and
# never use the session's Ray instance.
OWN_CLUSTER_MODULES = ("test_cli_operator.py", "test_cli_serve.py", "test_cli_store.py",
                       "test_demo_web.py")


def _spread_the_whole_suite(config: pytest.Config) -> None:
    """`python -m pytest` (the whole suite, as the README and CI run it) runs on
    SUITE_WORKERS pytest-xdist workers, scheduled by `_work_group`. A run that names files or
    directories stays in one process (-k or -m alone still select from the whole suite, and
    spread), as do runs with -n given or --pdb; MORPHOGEN_TEST_WORKERS sets the number of
    workers (0: one process).

    Set here, not in pyproject's addopts: tests/gpu also runs where pytest-xdist is absent,
    and there `-n` would be an unknown option."""
    if not config.pluginmanager.hasplugin("xdist") or hasattr(config, "workerinput"):
        return
    option = config.option
    if option.numprocesses is not None or option.usepdb or option.collectonly:
        return
    workers = int(os.environ.get("MORPHOGEN_TEST_WORKERS", SUITE_WORKERS))
    if config.args_source != pytest.Config.ArgsSource.TESTPATHS or workers <= 0:
        return
    option.numprocesses = workers
    option.tx = ["popen"] * workers
    option.dist = "load"
    config.stash[_GROUPED] = True


_GROUPED = pytest.StashKey[bool]()


def _work_group(nodeid: str) -> str:
    """The unit a worker takes whole: every test on the session's Ray instance (one instance
    for the suite, not one a worker); the multi-node scenario and the integration tests that
    start clusters of their own, one after another (each is several Ray processes: two at once
    beside the session's instance starve each other's timed steps on CI's two cores); any
    other test alone.

    From the test's id, because that is all the scheduler sees (xdist's own grouping by
    mark reads a node id that pytest 9.2 no longer lets it change)."""
    path = nodeid.split("::", 1)[0].replace("\\", "/")
    if "multinode/" in path:
        return "own-clusters"
    if "integration/" in path:
        own = path.rsplit("/", 1)[-1] in OWN_CLUSTER_MODULES
        return "own-clusters" if own else "serve-instance"
    return nodeid


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if not config.stash.get(_GROUPED, False):
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        """xdist's scope scheduling (largest units first), the units `_work_group`'s."""

        def _split_scope(self, nodeid: str) -> str:
            return _work_group(nodeid)

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The multi-node scenario first (in one process: spread, the largest units go first
    anyway). It runs a Ray cluster of several nodes of its own and needs this machine's cores
    while its load steps are timed; run after the integration modules, it shares them with
    this session's Ray instance and every party still deployed there (on 2 cores its shards
    then missed the scale-up it waits for)."""
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
