"""A Ray head whose dashboard starts beside its raylet, not before it.

``ray.init()`` and ``ray start --head`` start the GCS, then the dashboard, and wait (polling every 0.1 s)
until the dashboard has imported its modules and written its address; only then do they start the raylet,
and wait again until it has registered. On 2 cores each wait is a second or two of Python imports, one
after the other. Here the dashboard is started on a thread while the raylet starts, and the node's start
returns once both are up: the same processes, the same settings, the same dashboard address (and, for a
process whose children share its fate, the same fate: ``_Launcher``). What Ray hands the raylet's workers
as ``--webui`` is only checked for being given, as on a node without a dashboard. Where the raylet moves
the dashboard's processes into its cgroup (Ray's resource isolation), they must exist first, and the
order is Ray's own.

``python -m raymodel._ray.ray_start start --head ...`` is ``ray start`` with that order (``raymodel
server start``'s head).
"""

from __future__ import annotations

import contextlib
import queue
import sys
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterator


@contextlib.contextmanager
def dashboard_beside_raylet() -> Iterator[None]:
    """In this block, a Ray head started in this process (``ray.init``, ``ray start``) starts its
    dashboard on a thread while its raylet starts; the node's start waits for both, and raises what the
    dashboard's start raised."""
    from ray._private.node import Node

    start_api_server = getattr(Node, "start_api_server", None)
    if start_api_server is None:  # a Ray whose start is not the one described above: left as it is
        yield
        return
    node_init = Node.__init__

    def start_beside(self: Any, **kwargs: Any) -> None:
        if self.resource_isolation_config.is_enabled():
            start_api_server(self, **kwargs)
            return
        self._raymodel_dashboard_start = _LAUNCHER.submit(lambda: start_api_server(self, **kwargs))

    def init_then_join(self: Any, *args: Any, **kwargs: Any) -> None:
        node_init(self, *args, **kwargs)
        started = self.__dict__.pop("_raymodel_dashboard_start", None)
        if started is not None:
            started.result()  # raises what the dashboard's start raised

    Node.start_api_server = start_beside  # type: ignore[method-assign]
    Node.__init__ = init_then_join  # type: ignore[method-assign]
    try:
        yield
    finally:
        Node.start_api_server = start_api_server  # type: ignore[method-assign]
        Node.__init__ = node_init  # type: ignore[method-assign]


class _Launcher:
    """One thread, for the life of the process, that starts dashboards. A process that Ray starts to share
    its parent's fate is killed by the kernel when the *thread* that started it ends (``PR_SET_PDEATHSIG``):
    a thread of its own for each start would take its dashboard along when it returned. Not a
    ``ThreadPoolExecutor``: its thread ends at the interpreter's exit before the ``atexit`` hooks run, and
    would take the dashboard along before Ray's own shutdown; this daemon thread ends with the process."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def submit(self, call: Callable[[], Any]) -> Future[Any]:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="raymodel-dashboard-start", daemon=True)
                self._thread.start()
        future: Future[Any] = Future()
        self._calls.put((call, future))
        return future

    def _run(self) -> None:
        while True:
            call, future = self._calls.get()
            try:
                future.set_result(call())
            except BaseException as exc:  # noqa: BLE001 - raised again where the future is read
                future.set_exception(exc)


_LAUNCHER = _Launcher()


def main(argv: list[str]) -> int:
    """``ray`` (Ray's command line) with ``argv``, a head's dashboard started beside its raylet."""
    from ray.scripts.scripts import main as ray_main

    sys.argv = ["ray", *argv]
    with dashboard_beside_raylet():
        ray_main()  # Click's: it ends with SystemExit, its exit status
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
