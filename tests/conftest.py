"""One local Ray instance for the whole session; tiny seeded data; shared models."""

from __future__ import annotations

import gc
import os
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
#: No warm pools (``rm.init``'s default warms torch:2): each test starts what it uses, and the tests of
#: warm pools ask for them (its processes, ``raymodel server start`` included, inherit this).
os.environ["RAYMODEL_WARM"] = "none"
#: The Ray instances of the session, its own and the lane's clusters (set before any of them starts; each
#: inherits it): the log monitor looks for new worker log files once a second, not ten times (it does so
#: while there are fewer than 1,000: a session makes hundreds, and the looking took 3% of a core).
os.environ.update(LOG_NAME_UPDATE_INTERVAL_S="1", RAY_LOG_MONITOR_MANY_FILES_THRESHOLD="0")


def pytest_configure(config: pytest.Config) -> None:
    import beside
    import cpu_report
    import lane

    config.pluginmanager.register(lane, "raymodel-test-lane")  # the background lane (tests/lane.py)
    config.pluginmanager.register(cpu_report, "raymodel-test-cpu")  # what the session cost (tests/cpu_report.py)
    config.pluginmanager.register(beside, "raymodel-test-beside")  # a second session (tests/beside.py)
    config.addinivalue_line(
        "markers", "after(name): runs right after the test `name` of its module (on the pool that test left idle)"
    )


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``after(name)`` move next to that test (the lane's tests go last: ``tests/lane.py``)."""
    for item in [item for item in items if item.get_closest_marker("after")]:
        name = item.get_closest_marker("after").args[0]
        anchor = next((i for i in items if i.name == name and i.path == item.path), None)
        if anchor is not None:  # not selected: the test runs where it is
            items.remove(item)
            items.insert(items.index(anchor) + 1, item)


#: (when each test began, its id), in order: the cold pools' report finds the test that started each.
STARTED: list[tuple[float, str]] = []


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    import time

    STARTED.append((time.time(), nodeid))


#: The actors the session's Ray made, by class (read as the session's Ray ends): each a process of its
#: own, with its imports; the suite's time is mostly theirs.
ACTORS: dict[str, int] = {}


@pytest.hookimpl(trylast=True)  # after pytest's own, which tears the session's fixtures down (and fills ACTORS)
def pytest_sessionfinish(session: pytest.Session) -> None:
    _report_cold_pools()
    if ACTORS:
        print(
            f"actors of the session's Ray: {sum(ACTORS.values())}: "
            + ", ".join(f"{name} {n}" for name, n in sorted(ACTORS.items(), key=lambda item: -item[1]))
        )


def _report_cold_pools() -> None:
    """How many pools the session's training server started (each a cold start: a Train run, its
    workers and their framework's import), of which kind, and the test that started each."""
    import bisect
    import collections
    import json
    import re

    home = os.environ.get("RAYMODEL_HOME")
    folder = Path(home or "/nonexistent") / "jobs"
    if not STARTED or not folder.is_dir():
        return
    began = [t for t, _ in STARTED]
    by_test: collections.Counter[str] = collections.Counter()
    kinds: collections.Counter[str] = collections.Counter()
    for path in folder.glob("*.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        at = bisect.bisect_right(began, record.get("submitted") or 0.0) - 1
        test = STARTED[max(at, 0)][1].split("::")[-1]
        for line in record.get("log", ()):
            started = re.search(r" starting pool \S+ of (\d+) (\S+) worker", line)
            if started:  # "... starting pool <id> of 2 torch worker(s)"
                kind = f"{started.group(2)}:{started.group(1)}"
                by_test[f"{test} ({kind})"] += 1
                kinds[kind] += 1
    if by_test:
        print(
            f"\ncold pools (the session's server): {sum(by_test.values())}: "
            + ", ".join(f"{k} {n}" for k, n in kinds.most_common())
        )
        print("  " + "\n  ".join(f"{n} {name}" for name, n in sorted(by_test.items(), key=lambda item: -item[1])))


@pytest.fixture(scope="module", autouse=True)
def collected_after_each_module():
    """A Ray Data execution that failed keeps its actors, and their CPUs, until Python collects the
    reference cycle of its exception: after each module, collect, so that no module starts short of CPUs
    (a leaked 0.25 CPU left RLlib's PPO, which takes both, waiting for its env runner)."""
    yield
    gc.collect()


@pytest.fixture(scope="session", autouse=True)
def raymodel_home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Runs and the registry go to a temporary RAYMODEL_HOME."""
    from s3server import ENV

    home = tmp_path_factory.mktemp("raymodel_home")
    os.environ["RAYMODEL_HOME"] = str(home)
    os.environ.update(ENV)  # the test S3 server's credentials, for Ray's workers too (set before Ray starts)
    return home


@pytest.fixture(scope="session")
def ray_session(raymodel_home: Path):
    """The one local Ray instance of the test session (2 CPUs, dashboard on)."""
    import ray

    import raymodel as rm

    if ray.is_initialized():  # Ray's auto-init, by an earlier test that called Ray without this fixture
        pytest.fail(
            "Ray is already running in this process, started without raymodel's settings (no dashboard "
            "address of its own, Train's 2-s report poll): an earlier test touched Ray without `ray_session`."
        )
    rm.init(num_cpus=2)
    yield ray
    try:
        import collections

        from ray.util.state import list_actors

        ACTORS.update(
            collections.Counter(a.class_name for a in list_actors(limit=10_000, raise_on_missing_output=False))
        )
    except Exception as exc:  # noqa: BLE001 - a report only
        ACTORS["(not read: " + repr(exc)[:200] + ")"] = 0
    try:
        from ray import serve

        serve.shutdown()
    except Exception:  # noqa: BLE001 - best effort at the session's end
        pass
    ray.shutdown()


@pytest.fixture
def registry(tmp_path, monkeypatch):
    """An empty registry of the test's own (``RAYMODEL_REGISTRY``)."""
    import raymodel as rm

    monkeypatch.setenv("RAYMODEL_REGISTRY", str(tmp_path / "registry"))
    return rm.registry.open()


@pytest.fixture(scope="module")
def digits():
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X / 16.0).astype(np.float32), y


@pytest.fixture(scope="module")
def tiny():
    """16 rows, 4 features, 2 classes: batches are cheap and counts are predictable."""
    rng = np.random.default_rng(0)
    X = rng.normal(size=(16, 4)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    return X, y


@pytest.fixture(scope="module")
def tiny_data(tiny):
    """``tiny`` four times over (64 rows), a quarter held out: a few batches an epoch, for jobs."""
    import raymodel as rm

    X, y = tiny
    return rm.data.from_numpy(np.tile(X, (4, 1)), np.tile(y, 4), valid_fraction=0.25)


@pytest.fixture
def no_ray(monkeypatch):
    """Fail the test if anything tries to start or join Ray."""
    import raymodel._ray.cluster as cluster

    def forbidden(*args, **kwargs):
        raise AssertionError("Ray was touched before the input was checked")

    monkeypatch.setattr(cluster, "ensure_ray", forbidden)
    monkeypatch.setattr(cluster, "init", forbidden)
