"""`make tools` fails, naming what is missing, where it cannot install the system tools the tests
drive (chromium, wrk, iproute2's ip): the tests that need them then fail rather than pass untested."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_make_tools_fails_naming_a_tool_it_cannot_install(tmp_path: Path):
    bin_dir = tmp_path / "bin"  # a PATH with `id` but neither the tool nor apt-get
    bin_dir.mkdir()
    os.symlink(shutil.which("id"), bin_dir / "id")
    make = shutil.which("make")
    done = subprocess.run(
        [make, "--no-print-directory", "tools", "TOOLS=raymodel-no-such-tool"],
        cwd=ROOT,
        env={"PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0, done
    assert "missing raymodel-no-such-tool" in done.stderr and "apt-get install raymodel-no-such-tool" in done.stderr


def test_make_tools_passes_when_every_tool_is_there():
    done = subprocess.run(
        [shutil.which("make"), "--no-print-directory", "tools", "TOOLS=sh"], cwd=ROOT, capture_output=True, timeout=60
    )
    assert done.returncode == 0, done
