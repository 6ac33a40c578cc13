"""`wrk` (Debian's package, https://github.com/wg/wrk), an HTTP load generator nobody here wrote,
driven from Python: POST one JSON body over keep-alive connections, get its own counts back.

    from loadgen import wrk
    figures = wrk("http://127.0.0.1:8000/digits", {"pixels": [[0.0] * 64]}, connections=16, seconds=15)
    figures["rps"], figures["p50_ms"], figures["p99_ms"], figures["non_2xx"], figures["socket_errors"]
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Any

# wrk's Lua hooks: the request to send, and (in `done`) its own summary as one JSON line.
SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = io.open("%(body)s"):read("*a")
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    '\\nWRK-JSON {"requests": %%d, "duration_us": %%d, "non_2xx": %%d, "socket_errors": %%d, ' ..
    '"connect_errors": %%d, "read_errors": %%d, "write_errors": %%d, "timeouts": %%d, ' ..
    '"p50_us": %%d, "p90_us": %%d, "p99_us": %%d, "max_us": %%d}\\n',
    summary.requests, summary.duration, e.status, e.connect + e.read + e.write + e.timeout,
    e.connect, e.read, e.write, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max))
end
"""


def available() -> str | None:
    """The path of `wrk`, or None (`apt-get install wrk`; `make test` installs it where it can)."""
    return shutil.which("wrk")


def wrk(
    url: str,
    body: Any,
    *,
    connections: int = 16,
    threads: int = 2,
    seconds: float = 15,
    timeout_s: float = 10,
    stop: threading.Event | None = None,
) -> dict[str, float]:
    """Run wrk against ``url`` and return req/s, p50/p90/p99/max latency (ms), and its error counts.

    With ``stop``, setting the event ends the run early: wrk takes SIGINT as the end of its time
    and still prints its summary, so ``seconds`` is then an upper bound."""
    binary = available()
    if binary is None:
        raise RuntimeError("wrk is not installed: apt-get install wrk")
    with tempfile.TemporaryDirectory() as scratch:
        body_file = Path(scratch) / "body.json"
        body_file.write_text(json.dumps(body))
        script = Path(scratch) / "post.lua"
        script.write_text(SCRIPT % {"body": str(body_file)})
        with subprocess.Popen(
            [
                binary,
                f"-t{threads}",
                f"-c{connections}",
                f"-d{max(1, round(seconds))}s",
                f"--timeout={timeout_s:g}s",
                "-s",
                str(script),
                url,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ) as proc:
            if stop is not None:
                threading.Thread(
                    target=lambda: stop.wait(seconds) and proc.send_signal(signal.SIGINT), daemon=True
                ).start()
            stdout, stderr = proc.communicate(timeout=seconds + timeout_s + 30)
        if proc.returncode != 0:
            raise RuntimeError(f"wrk exited with {proc.returncode}: {stderr.strip()}")
    line = next(line for line in stdout.splitlines() if line.startswith("WRK-JSON "))
    raw = json.loads(line[len("WRK-JSON ") :])
    return {
        "rps": raw["requests"] / (raw["duration_us"] / 1e6),
        "requests": raw["requests"],
        **{
            k: raw[k] for k in ("non_2xx", "socket_errors", "connect_errors", "read_errors", "write_errors", "timeouts")
        },
        **{f"{q}_ms": raw[f"{q}_us"] / 1000 for q in ("p50", "p90", "p99", "max")},
    }


def cpu_seconds() -> dict[int, tuple[str, float]]:
    """Every process's CPU time so far (user + system, seconds) with its name, from /proc (Linux):
    the difference of two snapshots says which processes did the work of a load run."""
    import os

    tick = os.sysconf("SC_CLK_TCK")
    out: dict[int, tuple[str, float]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
        except OSError:  # gone meanwhile
            continue
        name, fields = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        out[int(pid)] = (name, (int(fields[11]) + int(fields[12])) / tick)
    return out


def cpu_used(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]]) -> dict[str, float]:
    """CPU seconds each process name used between two ``cpu_seconds()`` snapshots (a process that
    exited between them, such as wrk, is not counted)."""
    used: dict[str, float] = {}
    for pid, (name, seconds) in after.items():
        used[name] = used.get(name, 0.0) + seconds - before.get(pid, (name, 0.0))[1]
    return used
