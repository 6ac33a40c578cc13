"""Ray clusters of their own (``ray.cluster_utils.Cluster``) for the tests that need several nodes.

Such a cluster runs in a process of its own (``tests/multinode.py``, ``tests/nodeloss.py``), beside
the test session's Ray: ``run_script`` starts one and returns its ``RESULT`` lines; the scripts build
their head node with ``head_args``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TESTS = str(Path(__file__).parent)


def agent_ports() -> dict[str, int]:
    from s3server import free_port

    return {"dashboard_agent_listen_port": free_port(), "metrics_export_port": free_port()}


def head_args(scratch: Path) -> dict[str, Any]:
    """A head node with no CPUs for work (the driver's node), on ports of its own."""
    from s3server import free_port

    return {
        "num_cpus": 0,
        "temp_dir": str(scratch / "head"),
        "include_dashboard": True,
        "gcs_server_port": free_port(),
        "dashboard_port": free_port(),
        **agent_ports(),
    }


def clean_env() -> dict[str, str]:
    """This environment without what the test session's Ray and raymodel set."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYMODEL_", "PYTHONBREAKPOINT"))}


def run_script(script: str, args: list[str], env: dict[str, str], timeout: float) -> list[dict[str, Any]]:
    """Run ``tests/<script> <scratch dir> <args>`` in a fresh process (none of the variables this
    session's Ray set), assert it succeeded, and return its ``RESULT`` lines' JSON."""
    clean = {**clean_env(), "PYTHONPATH": TESTS, **env}
    nodes = tempfile.mkdtemp(prefix="rm-", dir="/tmp")  # short: Ray's socket paths must fit in 107 bytes
    try:
        out = subprocess.run(
            [sys.executable, os.path.join(TESTS, script), nodes, *args],
            env=clean,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    finally:
        shutil.rmtree(nodes, ignore_errors=True)
    assert out.returncode == 0, "\n".join(line for line in out.stderr.splitlines() if ".so" not in line)[-4000:]
    return [json.loads(line[7:]) for line in out.stdout.splitlines() if line.startswith("RESULT ")]
