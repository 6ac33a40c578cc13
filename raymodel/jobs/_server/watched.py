"""``Watched``: the calls the training server waits on (a job's run, a pool's end or readiness), each
with what to do when it ends; the server's loop wakes at the first end."""

from __future__ import annotations

import threading
from typing import Any, Callable

import ray


class Watched:
    def __init__(self) -> None:
        self.calls: dict[Any, Callable[[Any], None]] = {}
        self.wake = threading.Event()

    def watch(self, ref: Any, on_end: Callable[[Any], None]) -> None:
        """Call ``on_end(ref)`` from the server's loop once ``ref`` has ended. The loop wakes at its end,
        also when the call began while the loop was already waiting (a job ``submit`` launched), rather
        than at the end of that wait."""
        self.calls[ref] = on_end
        ref.future().add_done_callback(lambda _: self.wake.set())

    def ended(self) -> list[Any]:
        """The watched calls that have ended, without waiting."""
        refs = list(self.calls)
        return ray.wait(refs, num_returns=len(refs), timeout=0)[0] if refs else []

    def reap(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a watched call to end (back at the first), then handle each
        that has ended."""
        self.wake.clear()
        ready = self.ended()
        if not ready:
            self.wake.wait(timeout)
            ready = self.ended()
        for ref in ready:
            self.calls.pop(ref)(ref)
