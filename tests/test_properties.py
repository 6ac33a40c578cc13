"""Property-based suites (hypothesis), within a bounded example budget, plus 8 racing processes.

* registry names: random keys, aliases and versions never make any operation touch a path
  outside the registry root;
* registry histories: random put/delete/alias sequences keep versions monotonic and aliases
  pointing at live versions;
* settings: valid dicts construct, invalid ones raise one `SettingsError` naming every bad key;
* checkpoints: any mutation of the files or the manifest is a `CheckpointError`, and nothing is
  unpickled; loaded with any config, a checkpoint fits or is a raymodel error naming the parameter;
* prediction inputs of random shapes and dtypes answer or are a `DataError` (never torch's error);
  the same over HTTP, never a 500, is in test_serve.py.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from models import TinyNet

import raymodel as rm
from raymodel._internal import serialization
from raymodel.exceptions import CheckpointError, RegistryError, SettingsError

PYTHON = sys.executable
TESTS = str(Path(__file__).parent)
BUDGET = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow]
)


def _model(seed: int = 0) -> TinyNet:
    import torch

    torch.manual_seed(seed)
    model = TinyNet(config={"seed": seed})
    model.ensure_setup()
    return model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    return Path(_model().save(tmp_path_factory.mktemp("ckpt") / "ckpt"))


def _tree(root: Path) -> dict[str, int]:
    return {str(p): p.stat().st_size for p in root.rglob("*")}


# Text that mixes path syntax, control characters, unicode and plain names.
NAMES = st.one_of(
    st.text(min_size=0, max_size=40),
    st.text(alphabet="./\\\x00-_ab~$é", min_size=0, max_size=12),
    st.sampled_from(["..", "../x", "/etc", "a/../../b", ".", "", "x" * 300, "~root", "C:\\w", "ok", "ok.v2"]),
)
VERSIONS = st.one_of(
    st.none(), st.integers(min_value=-5, max_value=2**40), NAMES, st.booleans(), st.floats(allow_nan=True)
)


@BUDGET
@given(key=NAMES, alias=NAMES, version=VERSIONS)
def test_no_name_reaches_outside_the_registry_root(tmp_path_factory, key, alias, version):
    base = tmp_path_factory.mktemp("names")
    sentinel = base / "outside" / "versions" / "1"
    sentinel.mkdir(parents=True)
    (sentinel / "record.json").write_text("{}")
    reg = rm.registry.open(str(base / "registry"))
    before = {k: v for k, v in _tree(base).items() if "/registry" not in k}
    calls = [
        lambda: reg.get(key, version),
        lambda: reg.show(key, version),
        lambda: reg.list(key),
        lambda: reg.delete(key, version),
        lambda: reg.set_alias(key, alias, version),
        lambda: reg.remove_alias(key, alias),
        lambda: reg.resolve(key, version),
    ]
    for call in calls:
        try:
            call()
        except RegistryError:
            pass
    after = {k: v for k, v in _tree(base).items() if "/registry" not in k}
    assert before == after
    for path in (base / "registry").rglob("*"):
        assert path.resolve().is_relative_to((base / "registry").resolve())


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from([None, "prod", "stage"])),
        st.tuples(st.just("delete"), st.integers(min_value=1, max_value=8)),
        st.tuples(
            st.just("alias"), st.sampled_from(["prod", "stage", "canary"]), st.integers(min_value=1, max_value=8)
        ),
        st.tuples(st.just("unalias"), st.sampled_from(["prod", "stage", "canary"])),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_histories_keep_versions_monotonic_and_aliases_live(tmp_path_factory, ops):
    reg = rm.registry.open(str(tmp_path_factory.mktemp("history") / "registry"))
    model = _model()
    handed_out: list[int] = []
    live: set[int] = set()
    aliases: dict[str, int] = {}
    for op in ops:
        try:
            if op[0] == "put":
                n = reg.put(model, key="k", alias=op[1]).version
                assert not handed_out or n > max(handed_out)  # never reused, always up
                handed_out.append(n)
                live.add(n)
                if op[1]:
                    aliases[op[1]] = n
            elif op[0] == "delete":
                reg.delete("k", op[1])
                live.discard(op[1])
                aliases = {a: v for a, v in aliases.items() if v != op[1]}
            elif op[0] == "alias":
                reg.set_alias("k", op[1], op[2])
                aliases[op[1]] = op[2]
            else:
                reg.remove_alias("k", op[1])
                aliases.pop(op[1], None)
        except RegistryError:
            pass  # a missing version or alias: nothing changed
        records = reg.list("k") if live else []
        assert [r.version for r in records] == sorted(live)
        assert {a: r.version for r in records for a in r.aliases} == aliases


GOOD = {
    "num_workers": st.integers(0, 4),
    "num_epochs": st.integers(1, 50),
    "batch_size": st.integers(1, 512),
    "seed": st.integers(0, 2**32 - 1),
    "mode": st.sampled_from(["min", "max"]),
    "resources_per_worker": st.none() | st.dictionaries(st.sampled_from(["CPU", "GPU"]), st.floats(0, 4), max_size=2),
    "max_failures": st.integers(-1, 3),
    "nonfinite": st.sampled_from(["warn", "error", "allow"]),
}
BAD = {
    "num_workers": st.integers(max_value=-1) | st.floats() | st.text(max_size=3),
    "num_epochs": st.integers(max_value=0) | st.just(True),
    "batch_size": st.integers(max_value=0) | st.none(),
    "seed": st.integers(max_value=-1) | st.integers(min_value=2**32) | st.just(1.5),
    "mode": st.text(max_size=5).filter(lambda m: m not in ("min", "max")),
    "resources_per_worker": st.dictionaries(st.just("CPU"), st.sampled_from([-1.0, math.inf, math.nan]), min_size=1),
    "max_failures": st.integers(max_value=-2),
    "nonfinite": st.text(max_size=4),
}


@BUDGET
@given(data=st.data())
def test_settings_dicts_construct_or_name_every_bad_key(data):
    keys = data.draw(st.lists(st.sampled_from(sorted(GOOD)), unique=True, max_size=len(GOOD)))
    bad = set(data.draw(st.lists(st.sampled_from(keys), unique=True))) if keys else set()
    unknown = data.draw(st.lists(st.sampled_from(["num_worker", "epochs", "lr", "batchsize"]), unique=True, max_size=2))
    values = {k: data.draw(BAD[k] if k in bad else GOOD[k]) for k in keys}
    values.update({k: 1 for k in unknown})
    if not bad and not unknown:
        assert rm.TrainSettings.coerce(values) is not None
        return
    with pytest.raises(SettingsError) as info:
        rm.TrainSettings.coerce(values)
    for key in bad | set(unknown):
        assert f"`{key}`" in str(info.value), (key, str(info.value))


MUTATIONS = st.one_of(
    st.tuples(st.just("flip"), st.sampled_from(["class.pkl", "state/model.pt"]), st.integers(0, 10_000)),
    st.tuples(st.just("delete"), st.sampled_from(["class.pkl", "state/model.pt"])),
    st.tuples(st.just("add"), st.sampled_from(["extra.bin", "state/x.pkl", "class.pkl.bak"])),
    st.tuples(
        st.just("manifest"),
        st.sampled_from(["format", "format_version", "class", "backend", "config", "files"]),
        st.sampled_from([None, 3, "x", [], {}]),
    ),
    st.tuples(st.just("listing"), st.sampled_from(["drop", "digest", "traverse", "absolute"])),
    st.tuples(st.just("garbage"), st.binary(max_size=64)),
)


@BUDGET
@given(mutation=MUTATIONS)
def test_any_mutation_of_a_checkpoint_is_refused_before_unpickling(checkpoint, tmp_path_factory, monkeypatch, mutation):
    import shutil

    path = tmp_path_factory.mktemp("mutated") / "ckpt"
    shutil.copytree(checkpoint, path)
    manifest_path = path / "raymodel.json"
    manifest = json.loads(manifest_path.read_text())
    kind = mutation[0]
    if kind == "flip":
        target = path / mutation[1]
        data = bytearray(target.read_bytes())
        data[mutation[2] % len(data)] ^= 0xFF
        target.write_bytes(bytes(data))
    elif kind == "delete":
        (path / mutation[1]).unlink()
    elif kind == "add":
        (path / mutation[1]).write_bytes(b"planted")
    elif kind == "manifest":
        manifest[mutation[1]] = mutation[2]
    elif kind == "listing":
        files = manifest["files"]
        if mutation[1] == "drop":
            files.pop("class.pkl")
        elif mutation[1] == "digest":
            files["state/model.pt"] = "0" * 64
        else:
            files["../outside" if mutation[1] == "traverse" else "/etc/passwd"] = "0" * 64
    else:
        manifest_path.write_bytes(mutation[1])
    if kind != "garbage":
        manifest_path.write_text(json.dumps(manifest))
    unpickled = []
    monkeypatch.setattr(serialization, "loads", lambda data: unpickled.append(data))
    with pytest.raises(CheckpointError):
        rm.RayModel.from_checkpoint(path)
    assert unpickled == []


RACER = textwrap.dedent("""
    import json, random, sys
    sys.path.insert(0, {tests!r})
    import torch, raymodel as rm
    from raymodel.exceptions import RegistryError
    from models import TinyNet
    rng = random.Random(int(sys.argv[1]))
    model = TinyNet(config={{"writer": int(sys.argv[1])}})
    model.ensure_setup()
    mine = []
    for _ in range(6):
        op = rng.choice(["put", "put", "alias", "delete"])
        try:
            if op == "put":
                mine.append(rm.registry.put(model, key="race", alias=rng.choice([None, "prod"])).version)
            elif op == "alias":
                rm.registry.set_alias("race", rng.choice(["prod", "stage", "canary"]), rng.randint(1, 12))
            else:
                rm.registry.delete("race", rng.randint(1, 12))
        except RegistryError:
            pass
    print(json.dumps(mine))
""")


def test_eight_racing_processes_keep_the_registry_consistent(tmp_path, monkeypatch):
    root = tmp_path / "registry"
    monkeypatch.setenv("RAYMODEL_REGISTRY", str(root))
    script = tmp_path / "race.py"
    script.write_text(RACER.format(tests=TESTS))
    procs = [subprocess.Popen([PYTHON, str(script), str(i)], stdout=subprocess.PIPE, text=True) for i in range(8)]
    created = [n for p in procs for n in json.loads(p.communicate(timeout=300)[0].strip().splitlines()[-1])]
    assert all(p.returncode == 0 for p in procs)
    assert len(created) == len(set(created)) and created  # no number handed out twice
    versions = root / "race" / "versions"
    numbers = sorted(int(d.name) for d in versions.iterdir())
    assert set(created) <= set(numbers) and len(numbers) == len(set(numbers))
    reg = rm.registry.open(str(root))
    live = {r.version for r in reg.list("race")} if reg.keys() else set()
    for n in numbers:
        if n in live:
            assert json.loads((versions / str(n) / "record.json").read_text())["version"] == n
            reg.get("race", n)  # whole and verified
        else:  # deleted, or a put whose alias step lost a race: a tombstone, never a half version
            assert os.listdir(versions / str(n)) == ["DELETED"]
    for alias_file in (root / "race" / "aliases").glob("*.json"):
        assert json.loads(alias_file.read_text())["version"] in live, alias_file.name
    assert not any((root / "race" / ".staging").iterdir())  # no writer left anything behind


# ------------------------------------------------------- checkpoints loaded with other configs
SIZES = st.one_of(
    st.integers(min_value=-3, max_value=24),  # real sizes, zero and negatives (small: memory stays small)
    st.floats(allow_nan=True, width=32),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.lists(st.integers(0, 4), max_size=2),
)


@BUDGET
@given(config=st.dictionaries(st.sampled_from(["hidden", "in_features", "classes"]), SIZES, max_size=3))
def test_a_checkpoint_loaded_with_any_config_fits_or_is_a_raymodel_error(checkpoint, config):
    """`from_checkpoint(path, config=...)` with sizes that make other shapes, or values `setup` cannot
    use: it loads (when the shapes are the saved ones) or raises one of raymodel's errors, never torch's."""
    from raymodel.exceptions import ModelDefinitionError, RayModelError

    saved = {"hidden": 8, "in_features": 4, "classes": 2}
    try:
        model = TinyNet.from_checkpoint(checkpoint, config=config)
    except RayModelError as exc:
        assert isinstance(exc, (CheckpointError, ModelDefinitionError)), exc
        if isinstance(exc, CheckpointError):  # a shape mismatch names the parameter and both shapes
            assert re.search(r"`net\.\d\.(weight|bias)` has shape \([\d, ]*\) in the checkpoint and", str(exc))
        return
    merged = {**saved, **config}
    assert all(int(merged[k]) == saved[k] for k in saved)  # only a config of the saved shapes loads
    assert model.input_signature is None or model.input_signature["shape"] == [4]


# ------------------------------------------------------------------- prediction inputs
DTYPES = st.sampled_from(
    ["float16", "float32", "float64", "int8", "int64", "uint8", "bool", "complex64", "complex128", "U3", "object"]
)


def _arrays(draw_shape):
    from hypothesis.extra import numpy as hnp

    return DTYPES.flatmap(
        lambda dtype: hnp.arrays(
            dtype,
            draw_shape,
            elements=None
            if dtype != "object"
            else st.one_of(st.floats(allow_nan=True), st.none(), st.text(max_size=2)),
        )
    )


INPUTS = st.one_of(
    _arrays(st.sampled_from([(0,), (4,), (3,), (2, 4), (2, 3), (1, 2, 2), (2, 4, 1), ()])),
    st.recursive(
        st.one_of(st.floats(allow_nan=True), st.integers(-(10**30), 10**30), st.none(), st.text(max_size=2)),
        lambda inner: st.lists(inner, max_size=5),
        max_leaves=16,
    ),
)


@BUDGET
@given(x=INPUTS, policy=st.sampled_from(["warn", "error", "allow", None]))
def test_a_prediction_input_of_any_shape_and_dtype_answers_or_is_a_data_error(x, policy):
    """A model trained on rows of 4 (its signature), or one with none recorded (``policy=None``: the first
    layer checks the width, non-finite values are refused): any input answers (rows of 4 real numbers) or
    is a `DataError` (never torch's error); complex is always refused; non-finite values follow the policy."""
    import warnings

    import numpy as np

    from raymodel.exceptions import DataError

    model = _model()
    model.input_signature = None if policy is None else {"shape": [4], "dtype": "float32", "nonfinite": policy}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            out = model.predict(x)
        except DataError:
            return
        rows = np.asarray(x, dtype=np.float32)  # it answered: the input was numbers of the signature's shape
    assert rows.shape[1:] == (4,) or rows.shape == (4,), rows.shape
    assert np.asarray(x).dtype.kind != "c"
    if policy in ("error", None):
        assert np.isfinite(rows).all()
    assert np.asarray(out).shape[-1] == 2
