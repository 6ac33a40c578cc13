"""Pickle a model class by value, so it loads where its module does not exist.

cloudpickle already pickles classes from ``__main__`` by value. A class from an
importable module (a test file, a user's package on the driver only) would be
pickled by reference and fail to import on a worker or in another process; we
register its module for by-value pickling while we dump. raymodel itself, Ray,
numpy and every registered backend's framework modules are always pickled by
reference: the backend table (``raymodel/contract/_table.py``) hands them to
``pickle_by_reference`` when a backend registers.

For each function it pickles by value, cloudpickle looks for the submodules the
function reaches as attributes (``nn.functional``) by scanning all of
``sys.modules`` once per module global: with torch loaded that is 3,000 names,
about 7 ms for a small model class, paid by the client at submit, by the job's
runner and by rank 0 at every checkpoint. Within ``dumps`` that search reads an
index of ``sys.modules``, made again after any import, instead (``_submodules``):
the same answer, in 0.3 ms.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import types
from typing import Any, Iterator

import cloudpickle
import cloudpickle.cloudpickle as _cloudpickle

_BY_REFERENCE: set[str] = {"raymodel", "ray", "numpy", "cloudpickle", "builtins"}


def pickle_by_reference(*modules: str) -> None:
    """Always pickle the top-level packages of ``modules`` (``"torch.nn"`` -> ``torch``) by reference."""
    _BY_REFERENCE.update(m.split(".")[0] for m in modules)


def _by_reference_roots() -> frozenset[str]:
    return frozenset(_BY_REFERENCE)


@contextlib.contextmanager
def by_value(*objects: Any) -> Iterator[None]:
    """Within the block, cloudpickle the user modules defining ``objects`` by value."""
    registered: list[str] = []
    by_reference = _by_reference_roots()
    for obj in objects:
        cls = obj if isinstance(obj, type) else type(obj)
        for klass in cls.__mro__:
            name = klass.__module__
            module = sys.modules.get(name)
            if module is None or name == "__main__" or name.split(".")[0] in by_reference or name in registered:
                continue
            for each in (name, *_package_beside(name)):
                if each in registered:
                    continue
                try:
                    cloudpickle.register_pickle_by_value(sys.modules[each])
                except ValueError:  # already registered
                    continue
                registered.append(each)
    try:
        yield
    finally:
        for name in registered:
            module = sys.modules.get(name)
            if module is not None:
                with contextlib.suppress(ValueError):
                    cloudpickle.unregister_pickle_by_value(module)


def _package_beside(name: str) -> list[str]:
    """The modules of the user's package that ``name`` is in (``pkg`` and ``pkg.*`` loaded from files
    outside an installation's ``site-packages``): what a class of ``pkg.model`` may take from
    ``pkg.layers``, which travels with it. A top-level module has none."""
    top = name.split(".")[0]
    if top == name:
        return []
    beside = []
    for other, module in list(sys.modules.items()):
        if other != name and (other == top or other.startswith(top + ".")) and module is not None:
            path = getattr(module, "__file__", None) or ""
            if path and "site-packages" not in path and "dist-packages" not in path:
                beside.append(other)
    return beside


def dumps(obj: Any, *by_value_of: Any) -> bytes:
    """``cloudpickle.dumps`` with the user classes of ``by_value_of`` pickled by value."""
    with by_value(*by_value_of), _indexed_modules():
        return cloudpickle.dumps(obj)


def loads(data: bytes) -> Any:
    return cloudpickle.loads(data)


# ------------------------------------------------- cloudpickle's submodule search
_local = threading.local()  # set while this thread runs `dumps`
_scan_all = getattr(_cloudpickle, "_find_imported_submodules", None)

#: Under each package: ``{first name after it: [(position in sys.modules, module name, its names)]}``.
_Table = dict[str, list[tuple[int, str, frozenset[str]]]]
_index: dict[str, _Table] = {}
_indexed_at: tuple[int, str | None] = (-1, None)  # sys.modules' size and newest name when it was made
_index_lock = threading.Lock()


@contextlib.contextmanager
def _indexed_modules() -> Iterator[None]:
    outer = getattr(_local, "active", False)
    _local.active = True
    try:
        yield
    finally:
        _local.active = outer


def _submodules(code: types.CodeType, top_level_dependencies: Any) -> list[types.ModuleType]:
    """cloudpickle's ``_find_imported_submodules``: the modules under each package in
    ``top_level_dependencies`` that ``code`` can reach by attribute (every part of the submodule's
    name is one of ``code.co_names``), in ``sys.modules`` order.

    Inside ``dumps`` it reads an index of each package's submodules by their first name, made again
    whenever ``sys.modules`` has another size or another newest entry (an import adds one at its end),
    and takes each module from ``sys.modules`` as it is now. Elsewhere (another thread, Ray's own
    pickling) it is cloudpickle's own scan.
    """
    if _scan_all is None:
        return []
    if not getattr(_local, "active", False):
        return _scan_all(code, top_level_dependencies)
    names = set(code.co_names)
    found: list[types.ModuleType] = []
    for x in top_level_dependencies:
        if not (isinstance(x, types.ModuleType) and hasattr(x, "__package__") and x.__package__):
            continue
        table = _table(x.__name__)
        hits = sorted(hit for first in names & table.keys() for hit in table[first] if hit[2] <= names)
        found.extend(module for _, name, _ in hits if (module := sys.modules.get(name)) is not None)
    return found


def _table(package: str) -> _Table:
    global _indexed_at
    with _index_lock:
        now = (len(sys.modules), next(reversed(sys.modules), None))
        if now != _indexed_at:
            _index.clear()
            _indexed_at = now
        table = _index.get(package)
        if table is None:
            prefix, table = package + ".", {}
            for position, name in enumerate(list(sys.modules)):
                if name is not None and name.startswith(prefix):
                    parts = name[len(prefix) :].split(".")
                    table.setdefault(parts[0], []).append((position, name, frozenset(parts)))
            _index[package] = table
        return table


if _scan_all is not None:  # a cloudpickle without it finds submodules its own way
    _cloudpickle._find_imported_submodules = _submodules
