"""A replica's batches: where each runs (the event loop or a thread of its own), one ``forward`` per
batch, and a batch that fails retried request by request so only the culprit fails."""

from __future__ import annotations

import asyncio
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from raymodel.contract import batch_len, to_jsonable
from raymodel.contract.schema import schemas_of

#: Recent batches whose ``forward`` used less CPU than this run on the event loop, others on a thread.
#: CPU time, not wall time: a busy machine stretches a small model's wall time, not its work.
INLINE_BATCH_S = 0.002
#: ... unless they also took longer than this on the clock: a ``forward`` that waits (I/O, a sleep,
#: a lock) uses little CPU and would stall the loop.
INLINE_WALL_S = 0.05


class Failed:
    """A per-request failure travelling through the batch in place of an output."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc
        self.trace = "".join(traceback.format_exception(exc))


class BatchRunner:
    """Runs each batch on the event loop or on a thread of its own, by what recent batches cost
    (moving averages of their CPU and wall time; the first batch, not yet timed, goes to the thread)."""

    def __init__(
        self, run: Callable[[Any], Any], inline_s: float = INLINE_BATCH_S, inline_wall_s: float = INLINE_WALL_S
    ) -> None:
        self.run, self.inline_s, self.inline_wall_s = run, inline_s, inline_wall_s
        self.cpu_s = self.wall_s = float("inf")
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="raymodel-forward")

    def inline(self) -> bool:
        return self.cpu_s < self.inline_s and self.wall_s < self.inline_wall_s

    def where(self) -> str:
        return "event loop" if self.inline() else "forward thread"

    async def __call__(self, items: Any) -> Any:
        if self.inline():
            result, cpu, wall = self._timed(items)
        else:
            result, cpu, wall = await asyncio.get_running_loop().run_in_executor(self._thread, self._timed, items)
        first = self.cpu_s == float("inf")
        self.cpu_s = cpu if first else 0.8 * self.cpu_s + 0.2 * cpu
        self.wall_s = wall if first else 0.8 * self.wall_s + 0.2 * wall
        return result

    def _timed(self, items: Any) -> tuple[Any, float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()  # this thread's CPU: the batch's own work
        result = self.run(items)
        return result, time.thread_time() - cpu, time.perf_counter() - wall


def run_batch(items: list[tuple[Any, Any]]) -> list[tuple[Any, int]]:
    """One ``forward`` per model in the batch, then each request's ``postprocess``."""
    groups: dict[int, list[int]] = {}  # by model: two only while a new version is swapped in
    for i, (_, model) in enumerate(items):
        groups.setdefault(id(model), []).append(i)
    outputs: list[Any] = [None] * len(items)
    for indices in groups.values():
        model = items[indices[0]][1]
        for i, out in zip(indices, _forward_isolated(model, [items[i] for i in indices])):
            outputs[i] = out
    results = []
    for out, (_, model) in zip(outputs, items):
        if not isinstance(out, Failed):
            try:
                out = to_jsonable(schemas_of(type(model)).check_output(model.postprocess(out)))
            except Exception as exc:  # noqa: BLE001
                out = Failed(exc)
        results.append((out, len(items)))
    return results


def _forward_isolated(model: Any, items: list[tuple[Any, Any]]) -> list[Any]:
    """One batched ``forward``; if it fails, each request alone, so only the culprit fails."""
    try:
        return _forward_many(model, [x for x, _ in items])
    except Exception:  # noqa: BLE001 - find the culprit
        outputs = []
        for x, _ in items:
            try:
                outputs.append(_forward_many(model, [x])[0])
            except Exception as exc:  # noqa: BLE001
                outputs.append(Failed(exc))
        return outputs


def _forward_many(model: Any, inputs: list[Any]) -> list[Any]:
    inference = model.backend.inference
    sizes = [batch_len(x) for x in inputs]
    batch = inference.stack(inputs)
    with inference.mode(model):
        output = model.forward(batch)
    return inference.split(output, sizes)
