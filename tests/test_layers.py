"""The layers of docs/architecture.md, as the import-linter contracts in pyproject.toml state them:
they hold on the code, they fail on an upward import (inside a function or under TYPE_CHECKING too)
and on a cross-package private import, and no import circle remains in raymodel/ (counted with grimp,
lazy and TYPE_CHECKING imports included). Only raymodel/jobs/ knows the training server's actor, and no
two modules define a class of the same name, and no module takes another's private name. The test
modules read alone: none imports another (what
they share lives in helper modules beside them)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(root)}  # the copy's raymodel, not the installed one
    return subprocess.run(
        [LINT_IMPORTS, "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_contracts_hold_on_the_code():
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    assert f"{len(contracts)} kept, 0 broken" in result.stdout


BREAKS = {
    "an upward import inside a function": (
        "raymodel/_internal/storage.py",
        "\n\ndef _reaches_up():\n    from raymodel.model import RayModel\n\n    return RayModel\n",
        "raymodel._internal.storage -> raymodel.model",
    ),
    "an upward import under TYPE_CHECKING": (
        "raymodel/train/_result.py",
        "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from raymodel.tune import TuneResult\n",
        "raymodel.train._result -> raymodel.tune",
    ),
    "a private module of another package": (
        "raymodel/jobs/_server/queue.py",
        "\n\ndef _peek():\n    from raymodel.train._ray_train_run import RayTrainRun\n\n    return RayTrainRun\n",
        "raymodel.jobs._server.queue -> raymodel.train._ray_train_run",
    ),
    "a plug-in importing another": (
        "raymodel/backends/xgboost/__init__.py",
        "\n\ndef _borrow():\n    from raymodel.backends import lightgbm\n\n    return lightgbm\n",
        "raymodel.backends.xgboost -> raymodel.backends.lightgbm",
    ),
    "a plug-in importing another's private module": (
        "raymodel/backends/transformers/_loop.py",
        "\n\ndef _borrow():\n    from raymodel.backends.lightning._loop import LightningLoop\n\n"
        "    return LightningLoop\n",
        "raymodel.backends.transformers._loop -> raymodel.backends.lightning._loop",
        3,  # the plug-ins' independence, the torch family's layers (siblings), and lightning's private modules
    ),
    "torch's plug-in importing one built on it": (
        "raymodel/backends/torch/loop.py",
        "\n\ndef _borrow():\n    from raymodel.backends import lightning\n\n    return lightning\n",
        "raymodel.backends.torch.loop -> raymodel.backends.lightning",
        2,  # the torch family's layers, and the independence (transformers would reach lightning through it)
    ),
    "a plug-in not built on torch importing it": (
        "raymodel/backends/xgboost/__init__.py",
        "\n\ndef _borrow():\n    from raymodel.backends.torch import loop\n\n    return loop\n",
        "raymodel.backends.xgboost -> raymodel.backends.torch.loop",
    ),
}


@pytest.mark.parametrize("case", list(BREAKS))
def test_the_contracts_fail_on(case, tmp_path):
    module, added, chain, *broken = BREAKS[case]
    shutil.copytree(ROOT / "raymodel", tmp_path / "raymodel", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / module
    target.write_text(target.read_text() + added)
    result = _lint(tmp_path)
    assert result.returncode != 0, result.stdout
    assert f"{broken[0] if broken else 1} broken" in result.stdout, result.stdout
    assert chain in result.stdout, result.stdout


def test_every_private_module_is_protected_by_its_package_contract():
    """A new ``_module`` in a package is covered by that package's "private modules are its own" contract."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    protected = {c["allowed_importers"][0]: set(c["protected_modules"]) for c in contracts if c["type"] == "protected"}
    # every public package, a plug-in's subpackage (raymodel/backends/torch/) included; a private package
    # would be protected whole by its parent's contract
    packages = [
        p.parent
        for p in sorted((ROOT / "raymodel").rglob("__init__.py"))
        if p.parent != ROOT / "raymodel" and not any(part.startswith("_") for part in p.parent.relative_to(ROOT).parts)
    ]
    assert len(packages) > 15
    for package in packages:
        name = ".".join(package.relative_to(ROOT).parts)
        private = {
            f"{name}.{m.stem}"
            for m in package.iterdir()
            if m.name.startswith("_") and m.name != "__init__.py" and m.name != "__pycache__"
        }
        if private:
            assert protected.get(name) == private, name


def test_only_the_jobs_package_knows_the_training_server_actor():
    """Below ``raymodel.jobs`` the server is a port (``raymodel.contract.TrainingServer``): no module outside
    raymodel/jobs/ holds the actor's name or looks an actor up by it."""
    from raymodel.jobs._address import NAME

    outside = [p for p in (ROOT / "raymodel").rglob("*.py") if "jobs" not in p.relative_to(ROOT / "raymodel").parts]
    assert outside
    for path in outside:
        text = path.read_text()
        assert NAME not in text, path
        assert "job_server" not in text, path
        if "get_actor(" in text:  # the dashboard asks for Serve's controller, by Serve's own name; the
            # model server for its rollout controller, by the name it gives it
            assert (path.name == "_api.py" and "SERVE_CONTROLLER_NAME" in text) or (
                path.name == "rollout.py" and "get_actor(CONTROLLER" in text
            ), path


def test_no_two_modules_define_a_class_of_the_same_name():
    """One meaning per name across the package: a class name (public or private) is defined in one
    module of raymodel/ only, so a traceback or a search names one thing."""
    where: dict[str, list[str]] = {}
    for path in sorted((ROOT / "raymodel").rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ClassDef):
                where.setdefault(node.name, []).append(str(path.relative_to(ROOT)))
    assert len(where) > 50  # the walk found the package's classes
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert not twice, f"classes of one name in several modules (rename one): {twice}"


def _private_names_taken(source: str, package_root: Path) -> list[str]:
    """The private names (``_name``, not modules) that ``source`` imports from raymodel's modules, or reads
    as attributes of a raymodel module it imported."""

    def is_module(module: str, name: str) -> bool:
        base = package_root.joinpath(*module.split("."))
        return (base / f"{name}.py").exists() or (base / name / "__init__.py").exists()

    tree = ast.parse(source)
    taken, modules = [], set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raymodel"):
            for alias in node.names:
                if is_module(node.module or "", alias.name):
                    modules.add(alias.asname or alias.name)
                elif alias.name.startswith("_") and not alias.name.startswith("__"):
                    taken.append(f"{node.module}.{alias.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules:
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                taken.append(f"{node.value.id}.{node.attr}")
    return taken


def test_no_module_takes_another_modules_private_name():
    """What modules share is exported under a public name: no module of raymodel/ imports another's
    ``_helper`` or reads ``module._helper`` (a private module, ``_store``, is a package's own, and fine)."""
    taken = {
        str(path.relative_to(ROOT)): names
        for path in sorted((ROOT / "raymodel").rglob("*.py"))
        if (names := _private_names_taken(path.read_text(), ROOT))
    }
    assert not taken, f"private names taken from other modules (export them under a public name): {taken}"
    seeded = (
        "from raymodel.serve._replica.deployment import _hidden\nfrom raymodel.jobs import _store\n_store._secret()\n"
    )
    assert _private_names_taken(seeded, ROOT) == ["raymodel.serve._replica.deployment._hidden", "_store._secret"]


def test_no_class_is_made_of_parts_that_reach_into_each_other():
    """A part of the package owns its state and is called through its methods: no class of raymodel/
    inherits from two or more of the package's classes (mixins sharing attributes), and no class body
    declares, under ``TYPE_CHECKING``, members that another class defines."""
    ours: set[str] = set()
    trees = {path: ast.parse(path.read_text()) for path in sorted((ROOT / "raymodel").rglob("*.py"))}
    for tree in trees.values():
        ours.update(node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef))
    mixed, declared = [], []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not isinstance(node, ast.ClassDef):
                continue
            bases = [ast.unparse(base).split("[")[0].rsplit(".", 1)[-1] for base in node.bases]
            if len([base for base in bases if base in ours]) >= 2:
                mixed.append(f"{path.relative_to(ROOT)}: {node.name}({', '.join(bases)})")
            for statement in node.body:
                if isinstance(statement, ast.If) and "TYPE_CHECKING" in ast.unparse(statement.test):
                    declared.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert len(ours) > 100  # the walk found the package's classes
    assert not mixed, f"classes made of several of the package's classes (compose parts instead): {mixed}"
    assert not declared, f"classes declaring others' members under TYPE_CHECKING: {declared}"


def test_the_jobs_package_init_defines_nothing():
    """``raymodel/jobs/__init__.py`` re-exports what its modules define (it defines nothing)."""
    init = ast.parse((ROOT / "raymodel/jobs/__init__.py").read_text())
    defined = [n.name for n in init.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    assert defined == [], f"raymodel/jobs/__init__.py defines {defined}: move them into a module of the package"


def test_the_training_server_is_looked_up_in_one_place():
    """One function of ``jobs/_address.py`` (``find``) looks the training server's actor up."""
    lookups = [
        str(path.relative_to(ROOT))
        for path in sorted((ROOT / "raymodel/jobs").glob("*.py"))
        for _ in range(path.read_text().count("get_actor(NAME"))
    ]
    assert lookups == ["raymodel/jobs/_address.py"], lookups


def test_no_test_module_imports_another():
    """A test module is read as a specification on its own: shared models and helpers live in the helper
    modules of tests/ (models.py, traffic.py, browser.py, in_process.py, ...), not in another test module."""
    tests = ROOT / "tests"
    names = {p.stem for p in tests.glob("test_*.py")}
    found = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                imported = [node.module]
            elif isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            else:
                continue
            found += [f"{path.name}: {name}" for name in imported if name.split(".")[0] in names]
    assert len(names) > 40
    assert found == [], found


def test_the_architecture_map_names_every_module_of_the_package():
    """docs/architecture.md's layout lists every module of raymodel/, one line each: a module added,
    moved or removed without the map fails here (and a line for a module that is gone)."""
    text = (ROOT / "docs/architecture.md").read_text()
    block = text.split("## Layout", 1)[1].split("```", 2)[1]
    listed: list[str] = []
    folders: list[tuple[int, str]] = []  # (indent, name) of the folders above the current line
    for line in block.splitlines():
        if not line.strip() or line.startswith("tests/"):
            continue
        indent, name = len(line) - len(line.lstrip()), line.split()[0]
        while folders and folders[-1][0] >= indent:
            folders.pop()
        path = "".join(folder for _, folder in folders) + name
        if name.endswith("/"):
            folders.append((indent, name))
        else:
            assert name.endswith(".py"), line
            assert len(line.split()) > 1, f"no words for {path} in the map"
            listed.append(path)
    present = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "raymodel").rglob("*.py"))
    assert len(listed) == len(set(listed)), "a module is listed twice"
    assert sorted(listed) == present, {
        "not in the map": sorted(set(present) - set(listed)),
        "in the map, not in raymodel/": sorted(set(listed) - set(present)),
    }


def test_the_modules_that_docstrings_and_docs_name_exist():
    """A path (``jobs/_server/actor.py``) or a dotted name (``raymodel.jobs._port.ServerClient``) that the
    package's docstrings and comments, the docs or the README name is a module (or a name in one) that
    exists: a module that moves takes what names it along."""
    import importlib
    import re

    texts = [*(ROOT / "raymodel").rglob("*.py"), *(ROOT / "docs").rglob("*.md"), ROOT / "README.md"]
    packages = {p.stem if p.suffix else p.name for p in (ROOT / "raymodel").iterdir() if not p.name.startswith(".")}
    stale = set()
    for text_file in texts:
        text = text_file.read_text()
        for path in re.findall(r"(?<![\w./-])((?:[a-z_]+/)+[a-z_0-9]+\.py)\b", text):
            if not any((base / path).exists() for base in (ROOT, ROOT / "raymodel", ROOT / "raymodel/backends")):
                stale.add((text_file.name, path))
        for dotted in re.findall(r"\braymodel(?:\.[A-Za-z_][A-Za-z_0-9]*)+", text):
            parts = dotted.split(".")
            if parts[1] not in packages:  # a file or tag name that starts with "raymodel." (raymodel.json)
                continue
            k = max(k for k in range(2, len(parts) + 1) if _is_module(".".join(parts[:k])))
            found: object = importlib.import_module(".".join(parts[:k]))
            for name in parts[k:]:
                if not hasattr(found, name):
                    stale.add((text_file.name, dotted))
                    break
                found = getattr(found, name)
    assert not stale, f"names of modules that do not exist: {sorted(stale)}"


def _is_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ModuleNotFoundError, AttributeError, ValueError):  # a name inside a module, not a module
        return False


def test_no_import_circle_in_raymodel():
    graph = grimp.build_graph("raymodel", include_external_packages=False, exclude_type_checking_imports=False)
    circles = [c for c in _strongly_connected(graph) if len(c) > 1]
    assert not circles, f"import circles: {circles}"


def _strongly_connected(graph: grimp.ImportGraph) -> list[list[str]]:
    """Tarjan's algorithm over the module graph (iterative: no recursion limit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(graph.modules):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components
