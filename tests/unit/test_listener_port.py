"""Ports drawn for listeners that bind later: a cluster's HTTP port and HAProxy's stats and
metrics ports are drawn one after the other and bound only when Serve's proxy starts, so two
draws must never meet (a CI run had HAProxy's stats listener drawn on the HTTP port it was
about to bind, and the server refused to start with "Address already in use")."""

from __future__ import annotations

import os

import pytest

from cluster import local
from cluster.local import HAPROXY_PORT_VARS, fast_ingress_env, listener_port


def test_a_process_never_draws_one_port_twice():
    # 400 draws from some 12,000 ports: by chance alone several would repeat
    drawn = [listener_port() for _ in range(400)]
    assert len(set(drawn)) == len(drawn)


class _Draws:
    """Stands for the random source: hands out the given ports in order."""

    def __init__(self, ports: list[int]) -> None:
        self.ports = iter(ports)

    def randrange(self, low: int, high: int) -> int:
        return next(self.ports)


def test_haproxy_never_takes_the_port_it_is_told_to_avoid(monkeypatch):
    for name in HAPROXY_PORT_VARS:
        monkeypatch.delenv(name, raising=False)
    # the HTTP port another process (`morphogen serve --port`) is about to bind: the first
    # port the random source comes up with here, several times over
    http = listener_port()
    monkeypatch.setattr(local, "_HANDED_OUT", set())
    others = [listener_port() for _ in HAPROXY_PORT_VARS]
    monkeypatch.setattr(local, "_HANDED_OUT", set())
    draws = _Draws([p for other in others for p in (http, other)])
    monkeypatch.setattr(local.random, "SystemRandom", lambda: draws)
    env = fast_ingress_env(avoid=(http,))
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        pytest.skip("ray[serve] without its HAProxy ingress")
    assert all(int(env[name]) != http for name in HAPROXY_PORT_VARS)


def test_haproxy_given_the_http_port_is_refused_before_ray_starts(monkeypatch):
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.delenv("MORPHOGEN_FAST_INGRESS", raising=False)
    port = listener_port()
    os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = str(port)
    with pytest.raises(ValueError, match="RAY_SERVE_HAPROXY_STATS_PORT.*HTTP port"):
        local.start(port=port, disable_auth=True)


def test_each_cluster_has_a_fallback_proxy_of_its_own(monkeypatch):
    """HAProxy sends a request whose route has no live replica to the cluster's fallback proxy,
    on 8500 (gRPC 9500) unless told otherwise: with two clusters on one machine, a CI run's
    reader got the other cluster's 404 for a party whose router had just been killed."""
    for name in HAPROXY_PORT_VARS:
        monkeypatch.delenv(name, raising=False)
    env = fast_ingress_env()
    if env.get("RAY_SERVE_ENABLE_HA_PROXY") != "1":
        pytest.skip("ray[serve] without its HAProxy ingress")
    ports = [int(env[name]) for name in HAPROXY_PORT_VARS]
    assert int(env["RAY_SERVE_FALLBACK_PROXY_HTTP_PORT"]) not in (8500, 9500)
    assert int(env["RAY_SERVE_FALLBACK_PROXY_GRPC_PORT"]) not in (8500, 9500)
    assert len(set(ports)) == len(ports)
    assert len(set(ports) & {int(fast_ingress_env()[n]) for n in HAPROXY_PORT_VARS}) == 0
