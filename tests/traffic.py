"""Clients of a served route, on threads: what a route's users send while it changes."""

from __future__ import annotations

import threading
import time

import requests


class Clients:
    """``n`` clients sending requests with keys, one after another each, until stopped; every answer's
    status and version, in order."""

    def __init__(self, url: str, body: dict, n: int = 4) -> None:
        self.url, self.body = url, body
        self.answers: list[tuple[float, int, str | None]] = []
        self.stopped = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(n)]
        for t in self.threads:
            t.start()

    def _run(self, who: int) -> None:
        with requests.Session() as s:
            i = 0
            while not self.stopped.is_set():
                a = s.post(self.url, json=self.body, headers={"x-raymodel-key": f"user-{who}-{i}"}, timeout=30)
                self.answers.append((time.monotonic(), a.status_code, a.headers.get("x-raymodel-model")))
                i += 1

    def stop(self) -> list[tuple[float, int, str | None]]:
        self.stopped.set()
        for t in self.threads:
            t.join()
        return self.answers
