"""``until``: poll a condition for the tests (and the scripts they run in processes of their own)."""

from __future__ import annotations

import time
from typing import Any, Callable


def until(check: Callable[[], Any], timeout: float = 90.0, every: float = 0.2) -> Any:
    """``check()``'s first true value, polled every ``every`` s; ``AssertionError`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting")
