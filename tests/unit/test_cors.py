"""CORS on a party's query routes (morphogen/protocol/cors.py): which answers carry which
headers, for which origins, and the configuration that lists them."""

import argparse

import pytest
from pydantic import ValidationError

from morphogen.config import PartyConfig
from morphogen.protocol.codec import (
    ADMIN_SNAPSHOT_PATH,
    ADMIN_STATUS_PATH,
    ADMIN_UPDATES_PATH,
    BATCH_PATH,
    EPOCH_PATH,
    HEALTH_PATH,
    QUERY_PATH,
)
from morphogen.protocol.cors import Cors

PAGE = "http://127.0.0.1:5173"
OTHER = "https://evil.example"
ADMIN = (ADMIN_UPDATES_PATH, ADMIN_SNAPSHOT_PATH, ADMIN_STATUS_PATH)


def preflight(origin, method):
    return {"origin": origin, "access-control-request-method": method,
            "access-control-request-headers": "content-type"}


@pytest.mark.parametrize("path", [EPOCH_PATH, QUERY_PATH, BATCH_PATH])
def test_an_allowed_origin_is_echoed_on_the_routes_a_client_reads(path):
    cors = Cors([PAGE, "https://wallet.example"])
    h = cors.headers(path, PAGE)
    assert h["Access-Control-Allow-Origin"] == PAGE
    assert h["Vary"] == "Origin"
    assert h["Access-Control-Expose-Headers"] == "Retry-After"


@pytest.mark.parametrize("path", [EPOCH_PATH, QUERY_PATH, *ADMIN, HEALTH_PATH, "/nope"])
def test_others_get_no_cors_header(path):
    cors = Cors([PAGE])
    for origin in (OTHER, None, PAGE + "/", PAGE.upper()):
        assert not any(k.startswith("Access-Control") for k in cors.headers(path, origin))
    assert Cors().headers(path, PAGE) == {}  # none configured: nothing, not even Vary


@pytest.mark.parametrize("path", ADMIN)
def test_admin_routes_never_carry_cors_even_for_any_origin(path):
    cors = Cors(["*", PAGE])
    assert cors.headers(path, PAGE) == {}
    assert cors.preflight(path, preflight(PAGE, "POST")) is None


def test_any_origin_is_star_and_varies_on_nothing():
    h = Cors(["*"]).headers(QUERY_PATH, OTHER)
    assert h["Access-Control-Allow-Origin"] == "*" and "Vary" not in h


def test_preflight_answers_the_route_s_method_for_allowed_origins_only():
    cors = Cors([PAGE])
    p = cors.preflight(QUERY_PATH, preflight(PAGE, "POST"))
    assert p is not None
    assert p["Access-Control-Allow-Origin"] == PAGE
    assert p["Access-Control-Allow-Methods"] == "POST, OPTIONS"
    assert set(p["Access-Control-Allow-Headers"].split(", ")) == {"Content-Type", "Accept"}
    assert int(p["Access-Control-Max-Age"]) > 0
    assert cors.preflight(EPOCH_PATH, preflight(PAGE, "GET"))["Access-Control-Allow-Methods"] \
        == "GET, OPTIONS"
    assert cors.preflight(QUERY_PATH, preflight(OTHER, "POST")) is None
    assert cors.preflight(QUERY_PATH, preflight(PAGE, "PUT")) is None
    assert cors.preflight(EPOCH_PATH, preflight(PAGE, "POST")) is None
    assert cors.preflight(QUERY_PATH, {"origin": PAGE}) is None  # not a preflight


def test_the_configuration_takes_origins_as_a_browser_sends_them():
    cfg = PartyConfig(cors_origins=[PAGE, "*", "https://a.example:8443"])
    assert cfg.cors_origins == (PAGE, "*", "https://a.example:8443")
    assert PartyConfig().cors_origins == ()
    for bad in ("127.0.0.1:5173", PAGE + "/", PAGE + "/app", "", "http://"):
        with pytest.raises(ValidationError, match="scheme://host"):
            PartyConfig(cors_origins=[bad])


def test_serve_s_flag_sets_the_origins():
    from cluster.serve_plan import _overrides

    args = argparse.Namespace(matrix=None, shards=None, shard_cpus=None, router_cpus=None,
                              engine=None, admin_token_file=None, admin_snapshot_dir=None,
                              cors_origin=[PAGE, OTHER])
    assert _overrides(args)["cors_origins"] == (PAGE, OTHER)
    assert "cors_origins" not in _overrides(argparse.Namespace(**{**vars(args),
                                                                  "cors_origin": None}))
