"""A Ray instance that raymodel starts: its dashboard starts beside its raylet, not before it
(``raymodel/_ray/ray_start.py``), and the autoscaling coordinator that Ray Train's first run of an
instance waits for is asked for as the server's first pool starts (``jobs/_pools/keeper.py``)."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import pytest

from raymodel._ray import ray_start


class _Node:
    """Ray's ``Node`` as far as the start's order goes: its constructor starts the dashboard (which takes a
    while to be up), then the raylet."""

    failure: Exception | None = None

    def __init__(self, isolation: bool = False) -> None:
        self.resource_isolation_config = SimpleNamespace(is_enabled=lambda: isolation)
        self.events: list[str] = []
        self.start_api_server(include_dashboard=None, raise_on_failure=False)
        self.events.append("raylet started")

    def start_api_server(self, *, include_dashboard: bool | None, raise_on_failure: bool) -> None:
        self.dashboard_thread = threading.current_thread()
        time.sleep(0.3)
        if self.failure is not None:
            raise self.failure
        self.events.append("dashboard up")


@pytest.fixture
def node(monkeypatch):
    import ray._private.node

    monkeypatch.setattr(ray._private.node, "Node", _Node)
    monkeypatch.setattr(_Node, "failure", None)
    return _Node


def test_the_raylet_starts_while_the_dashboard_does_and_the_node_is_up_once_both_are(node):
    assert node().events == ["dashboard up", "raylet started"]  # Ray's order: one wait, then the other
    with ray_start.dashboard_beside_raylet():
        started = node()
    assert started.events == ["raylet started", "dashboard up"]  # the raylet did not wait; the node did
    # A child that shares its parent's fate dies when the *thread* that started it ends: the dashboard's
    # start runs on a thread that outlives it (not the caller's, not one that ends with the start).
    assert started.dashboard_thread is not threading.main_thread()
    assert started.dashboard_thread.is_alive()
    assert node().events == ["dashboard up", "raylet started"]  # Ray's own, outside the block
    assert node.__init__.__qualname__ == "_Node.__init__"


def test_the_dashboards_failure_is_raised_by_the_nodes_start(node):
    node.failure = RuntimeError("Failed to start the dashboard")
    with ray_start.dashboard_beside_raylet(), pytest.raises(RuntimeError, match="Failed to start the dashboard"):
        node()


def test_with_ray_resource_isolation_the_dashboard_starts_first_as_ray_starts_it(node):
    """The raylet moves the dashboard's processes into its cgroup as it starts: they must exist by then."""
    with ray_start.dashboard_beside_raylet():
        started = node(isolation=True)
    assert started.events == ["dashboard up", "raylet started"]
    assert started.dashboard_thread is threading.main_thread()


@pytest.mark.integration
def test_the_test_sessions_instance_has_its_dashboard_running_and_answering(ray_session):
    """``rm.init`` started this session's instance with its dashboard beside its raylet: the dashboard
    is still running after the start (a thread that ended would have taken it along) and answers."""
    import psutil
    from ray.util.state import list_nodes

    node = ray_session._private.worker.global_worker.node
    (dashboard,) = node.all_processes["dashboard"]
    assert psutil.Process(dashboard.process.pid).is_running() and dashboard.process.poll() is None
    assert node.webui_url and list_nodes()  # the state API, which Train V2 asks, answers


def test_the_autoscaling_coordinator_is_asked_for_once_by_rays_own_function_off_the_servers_thread(monkeypatch):
    from ray.data._internal.cluster_autoscaler import default_autoscaling_coordinator as coordinator

    from raymodel.jobs._pools import keeper

    calls = []
    made = threading.Event()

    def get_or_create() -> None:
        calls.append(threading.current_thread())
        made.set()

    monkeypatch.setattr(coordinator, "get_or_create_autoscaling_coordinator", get_or_create)
    monkeypatch.setattr(keeper, "_COORDINATOR_ASKED", threading.Event())
    keeper._coordinator_ahead()
    keeper._coordinator_ahead()  # the server's second pool
    assert made.wait(10)
    time.sleep(0.2)
    assert len(calls) == 1 and calls[0] is not threading.current_thread()

    def fails() -> None:
        made.set()
        raise RuntimeError("no coordinator here")

    raised = []
    monkeypatch.setattr(threading, "excepthook", raised.append)  # what a thread's uncaught exception reaches
    made.clear()
    monkeypatch.setattr(coordinator, "get_or_create_autoscaling_coordinator", fails)
    monkeypatch.setattr(keeper, "_COORDINATOR_ASKED", threading.Event())
    keeper._coordinator_ahead()  # the run's controller makes it, as without this: nothing raised here
    assert made.wait(10)
    time.sleep(0.2)
    assert raised == []
