"""Which Serve ingress a Ray instance started by raymodel gets, and the environment that says so (no cluster)."""

from __future__ import annotations

import os

import pytest

import raymodel as rm
from raymodel._internal import ingress
from raymodel.exceptions import SettingsError


def test_haproxy_is_the_default_and_a_bad_name_fails_before_ray_starts(monkeypatch):
    monkeypatch.delenv("RAYMODEL_SERVE_INGRESS", raising=False)
    assert ingress.resolve_ingress(None) == "haproxy"
    monkeypatch.setenv("RAYMODEL_SERVE_INGRESS", "proxy")
    assert ingress.resolve_ingress(None) == "proxy"
    assert ingress.resolve_ingress("haproxy") == "haproxy"
    with pytest.raises(SettingsError, match="serve_ingress.*'haproxy', 'proxy'.*'nginx'"):
        rm.init(serve_ingress="nginx")


def test_the_serve_environment_of_each_ingress():
    haproxy = ingress.with_serve_env({}, "haproxy")
    assert haproxy["RAY_SERVE_ENABLE_HA_PROXY"] == "1"
    assert haproxy["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    assert haproxy["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure empty-response"
    assert float(haproxy["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"]) < 30
    assert haproxy["RAY_SERVE_HAPROXY_METRICS_ENABLED"] == "0"  # replicas count their requests themselves
    assert 1 <= int(haproxy["RAY_SERVE_HAPROXY_NBTHREAD"]) <= max(1, min(4, os.cpu_count() or 1))
    ports = {haproxy["RAY_SERVE_HAPROXY_STATS_PORT"], haproxy["RAY_SERVE_HAPROXY_METRICS_PORT"]}
    assert len(ports) == 2 and "8404" not in ports  # free ports of its own, not Ray's fixed ones
    proxy = ingress.with_serve_env({}, "proxy")
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in proxy and proxy["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"


def test_what_the_user_set_wins_and_what_a_parent_process_set_is_replaced():
    mine = ingress.with_serve_env(
        {"RAY_SERVE_HAPROXY_STATS_PORT": "9999", "RAY_SERVE_HAPROXY_RETRY_ON": "conn-failure"}, "haproxy"
    )
    assert mine["RAY_SERVE_HAPROXY_STATS_PORT"] == "9999" and mine["RAY_SERVE_HAPROXY_RETRY_ON"] == "conn-failure"
    assert mine["RAYMODEL_SERVE_ENV_PID"] == str(os.getpid())
    # A subprocess of a raymodel process inherits its instance's ports: its own instance gets new ones.
    parent = {
        **ingress.with_serve_env({}, "haproxy"),
        "RAYMODEL_SERVE_ENV_PID": str(os.getpid() + 1),
        "RAY_SERVE_HAPROXY_STATS_PORT": "1",
    }
    child = ingress.with_serve_env(parent, "haproxy")
    assert child["RAY_SERVE_HAPROXY_STATS_PORT"] != "1" and child["RAYMODEL_SERVE_ENV_PID"] == str(os.getpid())
    # The same process asking again keeps what it has.
    assert ingress.with_serve_env(mine, "haproxy")["RAY_SERVE_HAPROXY_STATS_PORT"] == "9999"


def test_access_log_is_a_checked_serve_setting():
    assert rm.ServeSettings().access_log is False
    with pytest.raises(SettingsError, match="access_log.*True or False"):
        rm.ServeSettings(access_log="yes")
