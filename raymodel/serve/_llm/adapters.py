"""``AdapterServer``: an OpenAI route of a key's versions (``rm.Servable("poet-lora@*", "/v1",
settings=rm.ServeSettings(api="openai"))``), the version named per request by its ``model``
(``poet-lora:2``, ``poet-lora@production``).

Versions that are LoRA adapters of one base (their lineage's ``adapter_of``: the base's class and
weights' fingerprint) share that base in the replica: the first loads it (with its own adapter), the
others load only their adapter beside it, under their label; the base's one text engine decodes them
all in one batch, each row with its own adapter (peft's mixed-adapter batches). At most
``max_models_per_replica`` versions stay resident: past it the least recently used one not answering
a request is let go (its adapter deleted; a base stays while it is held). A version that is a whole
model is loaded as one and counts the same. Adapters are loaded and let go on the engine's thread,
between two steps of the batch.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from typing import Any

from raymodel._internal.name_rules import parse_ref
from raymodel.contract import text_generation
from raymodel.exceptions import RegistryError
from raymodel.serve._llm.openai import not_found
from raymodel.serve._replica.deployment import ModelReplica
from raymodel.serve._routes.plan import RoutePlan
from raymodel.serve._routes.traffic import VersionStats, multiplexed_stats


class AdapterServer(ModelReplica):
    """A replica of a route of a key's versions, answering OpenAI's API (see the module's docstring)."""

    def __init__(self, plan: RoutePlan, info: dict[str, Any], settings: Any) -> None:
        from raymodel.registry import Registry

        s = settings
        super().__init__({}, info, s.max_batch_size, s.batch_wait_timeout_s, s.max_body_bytes, s.api, s.api_keys)
        self.plan, self.max_models, self.poll_s = plan, s.max_models_per_replica, float(plan.poll_s)
        self.registry = Registry(plan.registry)
        self.resident: collections.OrderedDict[str, tuple[Any, str | None]] = collections.OrderedDict()
        self.bases: dict[tuple[str, str], Any] = {}  # (class, base fingerprint) -> the model holding its adapters
        self.in_use: collections.Counter[str] = collections.Counter()
        self.loading: dict[str, asyncio.Future[Any]] = {}
        self.resolved: dict[str, tuple[float, Any]] = {}
        self.base_loads = self.adapter_loads = self.evictions = 0
        self.figures = VersionStats()
        self._load_lock = threading.Lock()

    # ------------------------------------------------------------------ ids
    def _keys(self) -> list[str]:
        key = self.plan.key
        return self.registry.keys() if key == "*" else [key]

    def model_ids(self) -> list[str]:
        """Every version of the key (``poet-lora:2``), then its aliases (``poet-lora@production``)."""
        ids: list[str] = []
        for key in self._keys():
            records = self.registry.list(key)
            ids += [f"{r.key}:{r.version}" for r in records]
            ids += [f"{r.key}@{alias}" for r in records for alias in r.aliases]
        return ids

    def _label(self, name: str) -> str:
        """The version ``name`` names now (looked up again after ``registry_poll_s``: an alias moves)."""
        now = time.monotonic()
        hit = self.resolved.get(name)
        if hit is None or now - hit[0] > self.poll_s:
            try:
                key, version = parse_ref(name)
                if self.plan.multiplex not in ("*", key):
                    raise RegistryError(f"this route serves versions of `{self.plan.multiplex}`")
                hit = (now, f"{key}:{self.registry.resolve(key, version)}")
            except (RegistryError, ValueError):
                hit = (now, None)
            self.resolved[name] = hit
            if len(self.resolved) > 1000:
                self.resolved.pop(next(iter(self.resolved)))
        if hit[1] is None:
            raise not_found(name, self.model_ids())
        return str(hit[1])

    # ------------------------------------------------------------- choosing
    async def choose(self, name: str, request: dict[str, Any]) -> tuple[str, Any, str | None]:
        label = self._label(name)
        self.in_use[label] += 1  # until `record`: not let go while it answers
        try:
            model, adapter = await self._resident(label)
        except BaseException:
            self.in_use[label] -= 1
            raise
        return label, model, adapter

    def record(self, label: str, latency_s: float, failed: bool) -> None:
        self.in_use[label] -= 1
        self.figures.record(label, latency_s, failed)
        self.requests.append((time.time(), latency_s))

    def held_models(self) -> list[Any]:
        """(Also read from the loading thread: the dicts are copied whole first, under the GIL.)"""
        resident, bases = list(self.resident.values()), list(self.bases.values())
        return [*{id(m): m for m, _ in resident}.values(), *bases]

    async def _resident(self, label: str) -> tuple[Any, str | None]:
        if label in self.resident:
            self.resident.move_to_end(label)
            return self.resident[label]
        pending = self.loading.get(label)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self.loading[label] = loop.create_future()
            try:
                entry = await loop.run_in_executor(None, self._load, label)
                self.resident[label] = entry
                pending.set_result(entry)
                await self._evict()
            except BaseException as exc:
                pending.set_exception(exc)
                pending.exception()  # retrieved: other waiters re-raise it
                raise
            finally:
                self.loading.pop(label, None)
        return await asyncio.shield(pending)

    def _load(self, label: str) -> tuple[Any, str | None]:
        """One version at a time (two adapters of a base not yet held must not load it twice; and
        transformers' lazy imports are not safe from two threads at once)."""
        with self._load_lock:
            return self._load_one(label)

    def _load_one(self, label: str) -> tuple[Any, str | None]:
        from raymodel.registry import sources

        key, n = label.rsplit(":", 1)
        record = self.registry.show(key, int(n))
        adapter_of = record.lineage.get("adapter_of") or {}
        base_key = (record.model_class, str(adapter_of.get("fingerprint"))) if adapter_of else None
        base = self.bases.get(base_key) if base_key else None
        if base is not None:
            with sources.version_folder(self.registry.uri, key, int(n)) as folder:
                text = text_generation(base)
                self.engine_of(base).call(lambda: text.attach_adapter(base, folder, label)).result()
            self.adapter_loads += 1
            return base, label
        model = sources.load({"registry": self.registry.uri, "key": key}, int(n))
        text_generation(model)  # a version that does not generate text is refused, naming why
        if base_key is None:
            return model, None
        self.bases[base_key] = model
        self.base_loads += 1
        self.adapter_loads += 1
        return model, None  # the version loaded with the base is the base's own adapter

    async def _evict(self) -> None:
        """Past ``max_models_per_replica``, the least recently used versions not answering go (a whole
        model's engine closes when the next engine is made)."""
        for label in list(self.resident):
            if len(self.resident) <= self.max_models:
                return
            if self.in_use[label] > 0:
                continue
            model, adapter = self.resident.pop(label)
            self.evictions += 1
            if adapter is not None:  # an adapter beside a base: deleted between two steps
                text = text_generation(model)
                call = self.engine_of(model).call(lambda m=model, a=adapter, t=text: t.detach_adapter(m, a))
                await asyncio.wrap_future(call)

    # -------------------------------------------------------------- figures
    def describe(self) -> dict[str, Any]:
        figures = self.figures.summary()
        return {
            **self.info,
            "multiplex": self.plan.multiplex,
            "loaded": list(self.resident),
            "bases_loaded": self.base_loads,
            "adapters_loaded": self.adapter_loads,
            "evictions": self.evictions,
            **self.replica_info(),
            "versions": figures["versions"],
            "window_s": figures["window_s"],
        }

    def stats(self, window_s: float = 60.0) -> dict[str, Any]:
        return multiplexed_stats(self.info, self.figures, list(self.batch_sizes), window_s)
