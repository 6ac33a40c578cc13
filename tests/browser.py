"""Headless Chromium for the tests that look at a page: its DOM after its scripts ran, or a picture."""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).parent / "artifacts"  # screenshots: look at them (not committed)


def chromium() -> str:
    """The browser's binary; the test fails, saying how to install it, where there is none."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    pytest.fail("no chromium: `make tools` installs it (`apt-get install chromium`)")


def browse(binary: str, url: str, *args: str, budget_ms: int = 4000) -> str:
    """The page's DOM after its scripts ran (``--dump-dom``), or a screenshot with ``--screenshot=``."""
    with tempfile.TemporaryDirectory() as profile:
        command = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={budget_ms}",
            *(args or ["--dump-dom"]),
            url,
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)  # a busy 2-core machine
    assert done.returncode == 0 and (done.stdout or args), f"{url}: {done.stderr[-2000:]}"
    return done.stdout
