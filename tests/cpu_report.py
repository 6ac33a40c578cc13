"""What the suite costs the machine, printed at the session's end: the CPU time of every process
(this session's, its Ray instances', the lane's and the second session's) while it ran, read from
the kernel's counters in ``/proc/stat``, and the tests during which the most of it was spent.

The suite's cost is that CPU time, not its wall time (the VM's speed varies 2-3x, and a slow core
stretches both alike): it is the figure to compare between two commits. A test's figure is what the
whole machine spent while it ran, the lane's background processes included, so a test beside a busy
lane job reads high; the top of the list still says where the session's own time goes. The second
session's tests (``tests/beside.py``) count in the total, not in the list.

The module is a pytest plugin (``conftest.py`` registers it).
"""

from __future__ import annotations

import os
import time

import pytest

#: What the machine had spent (CPU-s) and the wall clock when the session began.
_START: list[float] = []
#: Each test's node id and the machine's CPU-s while it ran (setup, call and teardown).
SPENT: list[tuple[str, float]] = []


def busy_s() -> float:
    """The CPU time every process of the machine has spent since it booted, in seconds (user, nice,
    system, interrupts and stolen time of ``/proc/stat``'s first line: all but idle and iowait)."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:9]]
    except OSError:  # not Linux: nothing to report
        return 0.0
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def pytest_sessionstart(session: pytest.Session) -> None:
    _START[:] = [busy_s(), time.monotonic()]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    import beside

    before = busy_s()
    yield
    if item.nodeid not in beside.REPLAY.ids:  # (a test of the second session is counted in the total only)
        SPENT.append((item.nodeid, busy_s() - before))


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    if not _START or not SPENT:
        return
    cpu, wall = busy_s() - _START[0], time.monotonic() - _START[1]
    print(
        f"\nCPU time of the machine during the session: {cpu:.0f} CPU-s in {wall:.0f} s "
        f"({cpu / wall:.2f} cores busy on average; {len(SPENT)} tests)"
    )
    by_module: dict[str, float] = {}
    for nodeid, spent in SPENT:
        module = nodeid.split("::")[0]
        by_module[module] = by_module.get(module, 0.0) + spent
    top = sorted(by_module.items(), key=lambda item: -item[1])[:12]
    print("  by module: " + ", ".join(f"{name.removeprefix('tests/')} {s:.0f}" for name, s in top))
    for nodeid, spent in sorted(SPENT, key=lambda item: -item[1])[:15]:
        print(f"  {spent:7.1f} CPU-s  {nodeid}")
