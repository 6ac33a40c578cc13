"""What a user sees: the demo's steps print raymodel's own lines and nothing of Ray's, and a
terminal gets live progress bars. Each runs in a fresh process, as a user's script would."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path
from typing import Any

import lane
import pytest

ROOT = Path(__file__).resolve().parent.parent
STEPS = """
import socket
import sys
sys.path.insert(0, {examples!r})
import requests
import raymodel as rm
from digits import DigitsNet, load_data

X, y = load_data()
data = rm.data.from_numpy(X[:600], y[:600], valid_fraction=0.2)
rm.init(num_cpus=2)
model = DigitsNet()
result = model.train({{"num_workers": 2, "num_epochs": 3, "callbacks": [rm.callbacks.EarlyStopping(patience=2)]}},
                     data=data)
print(f"demo: trained, val_acc {{result.metrics['val_acc']:.3f}}")
tuned = model.tune(settings={{"num_samples": 2, "max_epochs": 2, "train": {{"resources_per_worker": {{"CPU": 0.95}}}}}},
                   data=data)
ref = rm.registry.put(tuned, key="digits", alias="production")
with socket.socket() as free:  # a free port now, not when the script began: the suite's routes take ports meanwhile
    free.bind(("127.0.0.1", 0))
    port = free.getsockname()[1]
app = rm.registry.get("digits", "production").serve("/digits", settings={{"port": port,
                                                                          "ray_actor_options": {{"num_cpus": 0.5}}}})
answer = requests.post(app.url, json={{"pixels": X[:1].tolist()}}, timeout=60)
print(f"demo: served {{answer.status_code}} {{answer.json()}}")
app.shutdown()
print("demo: done")
"""

#: raymodel's own lines: epoch and trial progress, the tuning summary, the script's prints.
OURS = [
    r"\[DigitsNet\] (epoch \d+/\d+|trial \d+ |\d+ trials; best |starting a pool of \d+ torch worker"
    r"|a warm pool of \d+ torch worker|waiting for )",
    r"demo: ",
    r"rank\s+trial\s+",
    r"\d+\s+\w+_\d{5}\s+",
]


def _env(tmp_path: Path) -> dict[str, str]:
    """A fresh user's environment: none of this session's Ray variables, its own home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "PYTHONBREAKPOINT"))}
    env.update(RAYMODEL_HOME=str(tmp_path / "home"), PYTHONUNBUFFERED="1")
    return env


@lane.job("demo", expected_s=90)
def _demo(scratch: Path) -> subprocess.CompletedProcess:
    from s3server import free_port

    script = STEPS.format(examples=str(ROOT / "examples"))
    # What a `ray start` that ended without `ray stop` leaves (as does any `ray.cluster_utils.Cluster`):
    # the address Ray's own `ray.init()` would join. `rm.init(num_cpus=2)` starts a local instance still.
    (scratch / "ray").mkdir()
    (scratch / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{free_port()}")
    env = {**_env(scratch), "RAY_TMPDIR": str(scratch)}
    return subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=500, cwd=scratch
    )


@pytest.mark.integration
@pytest.mark.lane("demo")
def test_the_demos_steps_print_only_raymodels_lines(lane):
    """The demo's steps as a user's script, in a fresh process and Ray (on the background lane)."""
    done = lane.result("demo")
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    foreign = [line for line in lines if not any(re.match(pattern, line) for pattern in OURS)]
    assert not foreign, "lines that are not raymodel's:\n" + "\n".join(foreign[:20])
    assert any(line.startswith("demo: served 200") for line in lines) and lines[-1] == "demo: done"
    assert sum(bool(re.match(r"\[DigitsNet\] epoch \d+/3", line)) for line in lines) >= 2


#: Two epochs of the digits example in this process (no workers), as a user's script.
TRAIN_SCRIPT = (
    f"import sys; sys.path.insert(0, {str(ROOT / 'examples')!r})\n"
    "import raymodel as rm\nfrom digits import DigitsNet, load_data\nX, y = load_data()\n"
    "DigitsNet().train({'num_workers': 0, 'num_epochs': 2, 'batch_size': 8},"
    " data=rm.data.from_numpy(X, y))\n"
)


def _joining(ray_session: Any, tmp_path: Path) -> dict[str, str]:
    """The script's environment: it joins this session's Ray (`RAY_ADDRESS`) rather than start its own."""
    return {**_env(tmp_path), "RAY_ADDRESS": ray_session.get_runtime_context().gcs_address}


def test_a_terminal_gets_live_bars(ray_session, tmp_path):
    env, script = _joining(ray_session, tmp_path), TRAIN_SCRIPT
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))  # a 120-column terminal
    process = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=follower, stderr=follower, cwd=tmp_path)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed: the process is done
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=300) == 0
    terminal = b"".join(chunks).decode(errors="replace")
    assert re.search(r"epoch 1: +\d+%\|.*\| *\d+/180 \[.*batch/s, loss=\d", terminal), terminal[-2000:]
    assert re.search(r"\[DigitsNet\] epochs: 100%\|.*\| 2/2", terminal)  # the epoch counter
    assert "[DigitsNet] epoch 2/2  loss" in terminal


def test_a_pipe_gets_plain_lines(ray_session, tmp_path):
    piped = subprocess.run(
        [sys.executable, "-c", TRAIN_SCRIPT],
        env=_joining(ray_session, tmp_path),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert piped.returncode == 0 and "%|" not in piped.stdout
    assert re.findall(r"^\[DigitsNet\] epoch (\d)/2  loss", piped.stdout, re.M) == ["1", "2"]
