"""How ``raymodel server stop`` ends a head: the job server first lets running jobs end their epoch
with a checkpoint (``drain``), then the head's processes get SIGTERM, a wait, and SIGKILL for what
remains (``terminate``), as ``ray stop`` does."""

from __future__ import annotations

import os
import subprocess
import time

from raymodel import jobs
from raymodel.jobs import init

#: How long the head's processes get to end after SIGTERM before SIGKILL (``ray stop`` waits 16 s).
TERM_WAIT_S = 15.0


def drain(address: str, grace_s: float) -> None:
    """Ask the job server to start no job and to end each running training job at its next epoch
    boundary with a checkpoint (``JobServer.drain``); wait up to ``grace_s`` for them, saying which."""
    import ray

    try:
        init(address=address)
        handle = jobs.server(start=False)
        asked = [] if handle is None else ray.get(handle.drain.remote(), timeout=30)
    except Exception as exc:  # noqa: BLE001 - a head that does not answer is stopped all the same
        print(f"the job server did not answer ({type(exc).__name__}: {exc}); stopping without waiting")
        return
    try:
        if not asked:
            return
        print(
            f"waiting up to {grace_s:g} s for {len(asked)} running job(s) to end their epoch and write a "
            f"checkpoint: {', '.join(asked)}",
            flush=True,
        )
        deadline = time.monotonic() + grace_s
        while True:
            states = {r["id"]: r for r in jobs.records(handle) if r["id"] in asked}
            running = [i for i, r in states.items() if r["status"] == "RUNNING"]
            if not running or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        for job_id, record in states.items():
            epoch = int(record.get("last_epoch") or 0)
            if record["status"] == "RUNNING":
                print(
                    f"  {job_id}: still in an epoch after {grace_s:g} s; it resumes from its newest checkpoint "
                    f"(epoch {epoch} or before) at the next `raymodel server start`"
                )
            elif record["status"] == "PENDING":
                print(
                    f"  {job_id}: checkpointed after epoch {epoch}; the next `raymodel server start` resumes it there"
                )
            else:
                print(f"  {job_id}: {record['status']}")
    except Exception as exc:  # noqa: BLE001 - the head is stopped all the same
        print(f"could not follow the jobs ({type(exc).__name__}: {exc}); stopping")
    finally:
        ray.shutdown()


def terminate(pids: list[int], wait_s: float, gently: bool = True) -> list[tuple[int, str]]:
    """SIGTERM ``pids`` (unless not ``gently``), wait up to ``wait_s`` for them to end, SIGKILL the rest:
    ``[(pid, name)]`` killed."""
    import signal

    names = _names(pids)
    for pid in pids if gently else ():
        try:
            os.kill(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + (wait_s if gently else 0.0)
    left = [pid for pid in pids if _running(pid)]
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if _running(pid)]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return [(pid, names.get(pid, "?")) for pid in left]


def with_descendants(pids: list[int]) -> list[int]:
    """``pids`` and every process they started, on down (``ps``: Linux and macOS). A head's raylet starts
    its workers and its dashboard a process server for its modules: their command lines do not name the
    head's folder (Ray's workers retitle themselves), and such a process can outlive its parent for a while
    under load. One of an old head that is still running when a new head starts on the same port reaches
    the new head's GCS at that address."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(fields[0]))
    found, todo = list(dict.fromkeys(pids)), list(pids)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.append(child)
                todo.append(child)
    return found


def start_times(pids: list[int]) -> dict[int, str]:
    """When each of ``pids`` that runs started: a process id that Ray's many short processes freed can be
    taken again, by a process of another start."""
    return _ps(pids, "lstart")


def _names(pids: list[int]) -> dict[int, str]:
    return _ps(pids, "comm")


def _ps(pids: list[int], field: str) -> dict[int, str]:
    """``ps``'s ``field`` of each of ``pids`` that runs (Linux and macOS)."""
    listed = ",".join(map(str, pids)) or "0"
    out = subprocess.run(["ps", "-o", f"pid=,{field}=", "-p", listed], capture_output=True, text=True)
    return {int(p): v.strip() for p, v in (line.split(None, 1) for line in out.stdout.splitlines() if line.strip())}


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, ended and not yet collected by its parent, does not)."""
    out = subprocess.run(["ps", "-o", "stat=", "-p", str(pid)], capture_output=True, text=True).stdout.strip()
    return bool(out) and not out.startswith("Z")
