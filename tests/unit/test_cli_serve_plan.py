"""What `morphogen serve` would run, from its flags, before anything starts: party names and
routes (case 1), and a config file read only when given (case 9)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cluster.cli import build_parser
from cluster.errors import UsageError
from cluster.serve_plan import plan
from deployments.naming import app_name

REPO = Path(__file__).resolve().parents[2]


def _plan(*argv: str):
    return plan(build_parser().parse_args(["serve", *argv]))


def _parties(p) -> list[tuple[str, str]]:
    return [(party.name, party.route_prefix) for party in p.parties]


def test_names_follow_routes_and_routes_follow_names() -> None:
    assert _parties(_plan()) == [("morphogen", "/")]
    assert _parties(_plan("--route-prefix", "/b")) == [("b", "/b")]
    assert _parties(_plan("--name", "b")) == [("b", "/b")]
    assert _parties(_plan("--name", "party-b", "--route-prefix", "/b")) == [("party-b", "/b")]
    assert _parties(_plan("--route-prefix", "/eu/b")) == [("eu-b", "/eu/b")]
    assert app_name("/") == "morphogen"


def test_parties_share_settings_under_their_own_names(tmp_path: Path) -> None:
    p = _plan("--parties", "a,b", "--shards", "3", "--shard-cpus", "0.25", "--epoch-log",
              str(tmp_path / "log"))
    assert _parties(p) == [("a", "/a"), ("b", "/b")]
    assert [x.config.num_shards for x in p.parties] == [3, 3]
    assert [x.config.shard_num_cpus for x in p.parties] == [0.25, 0.25]
    # one epoch log each: two parties appending to one log would corrupt it
    assert [x.config.epoch_log_dir for x in p.parties] == [str(tmp_path / "log" / "a"),
                                                          str(tmp_path / "log" / "b")]


@pytest.mark.parametrize(("argv", "text"), [
    (["--parties", "a"], "two or more names"),
    (["--parties", "a,a"], "share the application name a"),
    (["--parties", "a,b", "--name", "c"], "drop --name"),
    (["--name", "morphogen-index"], "reserved"),
    (["--name", "a b"], "application name 'a b'"),
    (["--app", "x"], "--app names an application of a --config file"),
])
def test_contradictions_are_refused(argv: list[str], text: str) -> None:
    with pytest.raises(UsageError, match=text):
        _plan(*argv)


def test_a_config_file_is_read_only_when_given(tmp_path: Path, monkeypatch) -> None:
    """Case 9: a ray_config.yaml in the working directory changes nothing unasked."""
    doc = {
        "http_options": {"host": "0.0.0.0", "port": 8123},
        "applications": [
            {"name": "x", "route_prefix": "/x", "args": {"num_shards": 5}},
            {"name": "y", "route_prefix": "/y", "args": {"num_shards": 1}},
        ],
    }
    (tmp_path / "ray_config.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.chdir(tmp_path)
    p = _plan()
    assert (p.host, p.port, p.http_given) == ("127.0.0.1", 8000, False)
    assert _parties(p) == [("morphogen", "/")] and p.parties[0].config.num_shards == 2

    given = _plan("--config", "ray_config.yaml")
    assert (given.host, given.port, given.http_given) == ("0.0.0.0", 8123, True)
    assert _parties(given) == [("x", "/x"), ("y", "/y")]
    assert [x.config.num_shards for x in given.parties] == [5, 1]
    one = _plan("--config", "ray_config.yaml", "--app", "y", "--host", "127.0.0.1")
    assert _parties(one) == [("y", "/y")] and one.host == "127.0.0.1"
    with pytest.raises(UsageError, match="--app z: no such application .* x, y"):
        _plan("--config", "ray_config.yaml", "--app", "z")


def test_the_repository_config_still_plans() -> None:
    p = _plan("--config", str(REPO / "ray_config.yaml"))
    assert _parties(p) == [("morphogen", "/")]
    assert (p.host, p.port) == ("0.0.0.0", 8000)


def test_a_bad_config_field_names_the_file_and_field(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"applications": [{"name": "a", "args": {"num_shard": 2}}]}))
    with pytest.raises(UsageError, match=r"--config .*bad.yaml application a: num_shard: Extra"):
        _plan("--config", str(bad))


def test_ray_address_in_the_environment_means_joining(monkeypatch) -> None:
    import argparse

    from cluster.serve_run import joined_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert joined_address(argparse.Namespace(address=None)) is None
    assert joined_address(argparse.Namespace(address="h:1")) == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert joined_address(argparse.Namespace(address=None)) == "10.0.0.5:6379"
    assert joined_address(argparse.Namespace(address="h:1")) == "h:1"
    monkeypatch.setenv("RAY_ADDRESS", "local")
    assert joined_address(argparse.Namespace(address=None)) is None


def test_a_joining_serve_binds_where_the_ingress_reaches_it() -> None:
    assert _plan().host == "127.0.0.1"  # a cluster of its own: this machine only
    assert _plan("--address", "10.0.0.5:6379").host == "0.0.0.0"
    assert _plan("--address", "10.0.0.5:6379", "--host", "10.0.0.5").host == "10.0.0.5"
