"""Which Serve ingress a Ray instance started by raymodel gets, and the environment that says so (no cluster)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import lane
import pytest

import raymodel as rm
from raymodel._ray import ingress
from raymodel.exceptions import SettingsError


def test_haproxy_is_the_default_ingress(monkeypatch):
    monkeypatch.delenv("RAYMODEL_SERVE_INGRESS", raising=False)
    assert ingress.resolve_ingress(None) == "haproxy"


def test_the_environment_chooses_another_ingress_and_an_argument_overrides_it(monkeypatch):
    monkeypatch.setenv("RAYMODEL_SERVE_INGRESS", "proxy")
    assert ingress.resolve_ingress(None) == "proxy"
    assert ingress.resolve_ingress("haproxy") == "haproxy"


def test_an_unknown_ingress_fails_before_ray_starts():
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
    names = ("HAPROXY_STATS", "HAPROXY_METRICS", "FALLBACK_PROXY_HTTP", "FALLBACK_PROXY_GRPC")
    ports = {haproxy[f"RAY_SERVE_{name}_PORT"] for name in names}
    assert len(ports) == 4 and not ports & {"8404", "9101", "8500", "9500"}  # free ports of its own, not Ray's
    proxy = ingress.with_serve_env({}, "proxy")
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in proxy and proxy["RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD"] == "0"
    for env in (haproxy, proxy):  # a proxy that starts slowly on a busy machine is not killed at Serve's 5 s
        assert float(env["RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S"]) >= 30


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


def test_haproxy_gets_a_folder_of_its_own_and_a_script_that_keeps_it_to_itself(tmp_path):
    env = ingress.with_serve_env({}, "haproxy")
    shim = env["RAY_SERVE_HAPROXY_BINARY_PATH"]
    folder = os.path.dirname(env["RAY_SERVE_HAPROXY_CONFIG_FILE_LOC"])
    assert shim.startswith(str(ingress.haproxy_base())) and os.path.dirname(shim) == folder
    assert env["RAY_SERVE_HAPROXY_SOCKET_PATH"].startswith(folder) and os.stat(folder).st_mode & 0o077 == 0
    assert ingress.with_serve_env(env, "haproxy") == env  # the same process again: the same folder
    # the script rewrites a config as Ray's template writes it, then runs the real binary
    config = tmp_path / "haproxy.cfg"
    config.write_text(
        "global\n    stats socket /x/admin.sock mode 666 level admin expose-fd listeners\n"
        "frontend prometheus\n    bind :9101\n    mode http\nfrontend http_frontend\n    bind 127.0.0.1:8000\n"
        "listen stats\n  bind *:8404\n  stats enable\n"
    )
    fake = tmp_path / "haproxy-real"
    fake.write_text('#!/bin/sh\necho "ran with $*"\n')
    fake.chmod(0o755)
    script = tmp_path / "shim"
    script.write_text(ingress.SHIM.replace("{binary}", str(fake)))
    script.chmod(0o755)
    out = subprocess.run([str(script), "-db", "-f", str(config), "-dR"], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == f"ran with -db -f {config} -dR"
    text = config.read_text()
    assert "bind 127.0.0.1:9101" in text and "bind 127.0.0.1:8404" in text and "bind 127.0.0.1:8000" in text
    assert "mode 600 level admin" in text and "mode 666" not in text


@lane.job("ingress", expected_s=90)
def _ingress(scratch: Path) -> list[dict]:
    from clusters import run_script

    env = {
        "RAYMODEL_HOME": str(scratch / "home"),
        "RAYMODEL_SERVER_FILE": str(scratch / "server.json"),
        "HOME": str(scratch),
    }
    return run_script("ingress.py", [], env, timeout=600)


@pytest.mark.integration
@pytest.mark.lane("ingress")
def test_the_ingress_listens_where_the_routes_do_and_ends_with_the_server(lane):
    """tests/ingress.py (on the background lane): serve on a `raymodel server start` head, stop it, start
    it, serve again."""
    (result,) = lane.result("ingress")
    first, after, again = result["first"], result["after_stop"], result["again"]
    assert first["status"] == 200 and again["status"] == 200 and again["url"] == first["url"]
    assert first["haproxy"] and first["listening"], first
    assert all(address.startswith("127.0.0.1:") for address in first["listening"]), first["listening"]
    assert f"127.0.0.1:{result['http']}" in first["listening"]
    assert first["folder_mode"] == "0o700" and first["socket_modes"] == ["0o600"], first
    assert first["stats_socket"] and all("mode 600 level admin" in s for s in first["stats_socket"]), first
    # its own fallback proxy, not Ray's fixed 8500 (another instance's, on a machine of two)
    assert first["fallback"] and not any(line.endswith(":8500 check backup") for line in first["fallback"]), first
    assert after == {"haproxy": [], "port": ""}, after  # no HAProxy outlives the server, the port is free


def test_serve_joins_its_controller_when_the_proxy_it_waited_for_was_replaced(monkeypatch):
    """Serve's controller kills a proxy that misses three health checks (seen at a busy suite's first
    `serve.start`: the start failed with the killed proxy's ActorDiedError) and starts another: raymodel
    then joins the controller, where the route's deploy waits for the new proxy."""
    import ray
    from ray import serve

    calls = []

    def start(http_options):
        calls.append(http_options)
        if len(calls) == 1:
            raise ray.exceptions.ActorDiedError()

    monkeypatch.setattr(serve, "start", start)
    ingress.start_http("127.0.0.1", 8123)
    assert calls == [{"host": "127.0.0.1", "port": 8123}] * 2
