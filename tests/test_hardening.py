"""Hostile and careless input: the registry, checkpoints, settings, data, the CLI and `predict`.

One test (or a few) per class of defect; each fails on round 1's code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from models import TinyNet

import raymodel as rm
from raymodel._internal import tmp
from raymodel.exceptions import CheckpointError, ChecksumError, DataError, RegistryError, SettingsError

PYTHON = sys.executable
TESTS = str(Path(__file__).parent)


def _model(seed: int = 0) -> TinyNet:
    import torch

    torch.manual_seed(seed)
    model = TinyNet(config={"seed": seed})
    model.ensure_setup()
    return model


def _cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "raymodel.cli", *args], capture_output=True, text=True, env={**os.environ, **env}
    )


# ------------------------------------------------------------ 1. path traversal
TRAVERSALS = ["../outside", "..", ".", "/tmp/x", "a/b", "a\\b", "", " ", "x\x00y", "-rf", ".hidden", "é", "a" * 200]


def test_no_registry_entry_point_reaches_outside_its_root(registry, tmp_path):
    # A model that an attacker planted beside the registry: round 1 loaded it with `get("../outside")`.
    reg_root = Path(registry.uri)
    rm.registry.put(_model(), key="real")
    shutil.copytree(reg_root / "real", tmp_path / "outside")
    before = sorted(str(p) for p in tmp_path.rglob("*") if reg_root not in p.parents)
    for key in TRAVERSALS:
        for call in (
            lambda key=key: rm.registry.get(key),
            lambda key=key: rm.registry.show(key),
            lambda key=key: rm.registry.list(key),
            lambda key=key: rm.registry.delete(key, 1),
            lambda key=key: rm.registry.set_alias(key, "prod", 1),
            lambda key=key: rm.registry.remove_alias(key, "prod"),
            lambda key=key: rm.registry.put(_model(), key=key),
        ):
            with pytest.raises(RegistryError):
                call()
    for alias in TRAVERSALS + ["12"]:
        with pytest.raises(RegistryError):
            rm.registry.set_alias("real", alias, 1)
        with pytest.raises(RegistryError):
            rm.registry.get("real", alias)
    for version in (0, -1, True, 2.5, "../1", 2**40):
        with pytest.raises(RegistryError):
            rm.registry.get("real", version)
    after = sorted(str(p) for p in tmp_path.rglob("*") if reg_root not in p.parents)
    assert before == after  # nothing outside the root was read into a model, changed or removed


def test_run_names_cannot_escape_their_storage_folder():
    for name in ("../escape", "/abs", "a/b", ".."):
        with pytest.raises(SettingsError, match="`name` must be 1 to 128 characters"):
            rm.TrainSettings(name=name)
        with pytest.raises(SettingsError, match="`name` must be"):
            rm.TuneSettings(name=name)
        with pytest.raises(SettingsError, match="`name` must be"):
            rm.ServeSettings(name=name)


# ------------------------------------------------------- 2. monotonic versions
def test_a_deleted_version_number_is_never_handed_out_again(registry):
    for seed in range(3):
        rm.registry.put(_model(seed), key="mono")
    rm.registry.delete("mono", 3)
    assert rm.registry.put(_model(9), key="mono").version == 4  # round 1 gave 3 again
    rm.registry.delete("mono", 4)
    rm.registry.delete("mono", 1)
    assert rm.registry.put(_model(8), key="mono").version == 5
    with pytest.raises(RegistryError, match="no version 3"):
        rm.registry.get("mono", 3)
    assert [r.version for r in rm.registry.list("mono")] == [2, 5]


# -------------------------------------------------------- 3. atomic aliases
SET_ALIAS = textwrap.dedent("""
    import sys
    import raymodel as rm
    rm.registry.set_alias("shared", f"alias{sys.argv[1]}", 1 + int(sys.argv[1]) % 2)
""")


def test_concurrent_alias_updates_are_all_kept(registry, tmp_path):
    rm.registry.put(_model(0), key="shared")
    rm.registry.put(_model(1), key="shared")
    script = tmp_path / "alias.py"
    script.write_text(SET_ALIAS)
    procs = [subprocess.Popen([PYTHON, str(script), str(i)]) for i in range(8)]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    aliases = {a for r in rm.registry.list("shared") for a in r.aliases}
    assert aliases == {f"alias{i}" for i in range(8)}  # round 1 kept 3 to 5 of them


# ------------------------------------------- 4. corrupt metadata, whole puts
def test_a_corrupt_record_spoils_only_its_own_version(registry):
    for seed in range(3):
        rm.registry.put(_model(seed), key="k")
    rm.registry.put(_model(), key="other")
    record = Path(registry.uri) / "k" / "versions" / "2" / "record.json"
    record.write_text("{not json")
    with pytest.warns(RuntimeWarning, match=r"record\.json"):
        listed = rm.registry.list()
    assert sorted((r.key, r.version) for r in listed) == [("k", 1), ("k", 3), ("other", 1)]
    with pytest.raises(RegistryError, match=f"{record}.*corrupt"):
        rm.registry.show("k", 2)
    with pytest.raises(RegistryError, match="corrupt"):
        rm.registry.get("k", 2)
    assert rm.registry.get("k", 3).config["seed"] == 2


def test_a_put_whose_alias_step_fails_publishes_nothing(registry, monkeypatch):
    rm.registry.put(_model(0), key="whole")

    def broken(self, key, alias, version):
        raise OSError("disk full")

    with monkeypatch.context() as patch:
        patch.setattr(type(registry), "set_alias", broken)
        with pytest.raises(RegistryError, match="disk full"):
            rm.registry.put(_model(1), key="whole", alias="production")
    assert [r.version for r in rm.registry.list("whole")] == [1]  # a retry cannot duplicate it
    assert rm.registry.put(_model(1), key="whole", alias="production").version == 3


# ------------------------------------------------------- 5. fail-closed checksums
EVIL = textwrap.dedent("""
    import os, pickle
    class Evil:
        def __reduce__(self):
            return (os.system, ("touch {marker}",))
    open({path!r}, "wb").write(pickle.dumps(Evil()))
""")


@pytest.mark.parametrize("tamper", ["drop_files", "unlisted_extra", "partial_listing", "bad_digest"])
def test_a_manifest_that_does_not_cover_every_file_is_refused_before_unpickling(tmp_path, tamper):
    path = Path(_model().save(tmp_path / "ckpt"))
    manifest = json.loads((path / "raymodel.json").read_text())
    marker = tmp_path / "pwned"
    if tamper == "drop_files":  # round 1 verified nothing and unpickled class.pkl
        subprocess.run([PYTHON, "-c", EVIL.format(marker=marker, path=str(path / "class.pkl"))], check=True)
        del manifest["files"]
    elif tamper == "unlisted_extra":
        (path / "state" / "extra.pkl").write_bytes(b"whatever")
    elif tamper == "partial_listing":
        subprocess.run([PYTHON, "-c", EVIL.format(marker=marker, path=str(path / "class.pkl"))], check=True)
        manifest["files"] = {"state/model.pt": manifest["files"]["state/model.pt"]}
    else:
        manifest["files"]["class.pkl"] = "not-a-digest"
    (path / "raymodel.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError):
        rm.RayModel.from_checkpoint(path)
    assert not marker.exists(), "the checkpoint's pickle ran"


def test_an_unlisted_file_is_a_checksum_error_naming_it(tmp_path):
    path = Path(_model().save(tmp_path / "ckpt"))
    (path / "state" / "sneaky.pkl").write_bytes(b"x")
    with pytest.raises(ChecksumError, match="sneaky.pkl"):
        rm.RayModel.from_checkpoint(path)


# ----------------------------------------------------------- 6. leaked folders
def _dead_pid() -> int:
    proc = subprocess.Popen([PYTHON, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_folders_of_killed_writers_are_collected_and_live_ones_kept(registry, tmp_path):
    rm.registry.put(_model(0), key="leak")
    dead = tmp.owned_name("put").rsplit("-", 2)[0] + f"-{_dead_pid()}-dead"
    live = tmp.owned_name("put")  # this process: alive
    staging = Path(registry.uri) / "leak" / ".staging"
    for name in (dead, live):
        (staging / name / "v").mkdir(parents=True)
        (tmp.root() / name).mkdir(parents=True, exist_ok=True)
    rm.registry.put(_model(1), key="leak")
    for parent in (staging, tmp.root()):
        names = {p.name for p in parent.iterdir()}
        assert dead not in names and live in names, parent
        shutil.rmtree(parent / live)


def test_a_failed_save_leaves_no_staging_folder(tmp_path, monkeypatch):
    model = _model()
    monkeypatch.setattr(type(model.backend), "write_state", lambda *a: (_ for _ in ()).throw(OSError("full")))
    with pytest.raises(OSError, match="full"):
        model.save(tmp_path / "ckpt")
    assert list(tmp_path.iterdir()) == []


# --------------------------------------------------------------- 7. settings
@pytest.mark.parametrize(
    "settings,fragment",
    [
        ({"seed": -1}, "`seed` must be an int from 0 to 4294967295"),
        ({"seed": 2**40}, "`seed` must be an int from 0 to 4294967295"),
        ({"resources_per_worker": {"CPU": math.inf}}, "`resources_per_worker` must be a dict"),
        ({"resources_per_worker": {"CPU": math.nan}}, "`resources_per_worker` must be a dict"),
        ({"resources_per_worker": {"": 1}}, "`resources_per_worker` must be a dict"),
        ({"storage_path": "  "}, "`storage_path` must not be empty"),
    ],
)
def test_train_settings_that_would_fail_on_the_workers_fail_here(settings, fragment):
    with pytest.raises(SettingsError) as info:
        rm.TrainSettings(**settings)
    assert fragment in str(info.value)


def test_serve_settings_take_only_finite_non_negative_numbers():
    with pytest.raises(SettingsError, match=r"ray_actor_options\['num_cpus'\]` must be a finite number >= 0"):
        rm.ServeSettings(ray_actor_options={"num_cpus": -1})
    with pytest.raises(SettingsError, match="finite"):
        rm.ServeSettings(batch_wait_timeout_s=math.inf)


def test_tune_settings_take_only_a_finite_time_budget():
    with pytest.raises(SettingsError, match="finite"):
        rm.TuneSettings(time_budget_s=math.nan)


def test_an_unknown_key_does_not_hide_a_bad_value_beside_it():
    with pytest.raises(SettingsError) as info:
        rm.TrainSettings.coerce({"num_worker": 2, "num_epochs": -3, "seed": -1})
    text = str(info.value)
    assert "num_worker" in text and "`num_epochs` must be" in text and "`seed` must be" in text


def test_settings_cannot_be_changed_after_they_were_checked(tiny):
    settings = rm.TrainSettings(num_workers=2, resources_per_worker={"CPU": 1})
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.num_workers = -5
    settings.resources_per_worker["CPU"] = -1  # a dict inside is still a dict: caught where it is used
    X, y = tiny
    with pytest.raises(SettingsError, match="resources_per_worker"):
        TinyNet().train(settings, data=rm.data.from_numpy(X, y))


# ------------------------------------------------------------------- 8. data
def test_data_that_cannot_be_right_is_refused_naming_the_array(tiny):
    X, y = tiny
    with pytest.raises(DataError, match="X is complex"):
        rm.data.from_numpy(X.astype(np.complex64) + 1j, y)
    import pandas as pd

    with pytest.raises(DataError, match="complex"):
        rm.data.from_pandas(pd.DataFrame({"a": X[:, 0] + 1j, "label": y}), label="label")
    with pytest.raises(DataError, match="unsigned labels up to 18446744073709551615"):
        rm.data.from_numpy(X, np.full(len(X), 2**64 - 1, dtype=np.uint64))
    with pytest.raises(DataError, match=r"`train` and `valid` X differ.*\(16, 4\).*\(4, 3\)"):
        rm.data.resolve({"train": (X, y), "valid": (X[:4, :3], y[:4])})


def test_nonfinite_values_warn_or_fail_before_ray(tiny, monkeypatch):
    from raymodel._ray import cluster

    X, y = tiny
    X = X.copy()
    X[3, 1] = np.nan
    X[5, 0] = np.inf
    data = rm.data.from_numpy(X, y, valid_fraction=0)
    monkeypatch.setattr(cluster, "ensure_ray", lambda *a, **k: pytest.fail("Ray was touched"))
    with pytest.raises(DataError, match=r"split 'train' X: 2 of 64 values"):
        TinyNet().train({"nonfinite": "error"}, data=data)
    with pytest.warns(RuntimeWarning, match="NaN or infinite"), pytest.raises(pytest.fail.Exception):
        TinyNet().train({}, data=data)  # the warning comes first, then Ray would start


# -------------------------------------------------------------------- 9. CLI
def test_the_cli_answers_every_error_in_one_line(tmp_path):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    ok = tmp_path / "registry"
    cases = [
        (["--registry", str(a_file), "models", "list"], "is a file"),
        (["--registry", "foo://bucket/r", "models", "list"], "Cannot open the registry"),
        (["--registry", "/sys/raymodel-registry", "models", "list"], "permission denied"),
        (["--registry", str(ok), "models", "show", "digits:x"], "must be a version number"),
        (["--registry", str(ok), "models", "show", "../etc"], "A registry key must be"),
        (["--registry", str(ok), "models", "delete", "k", "-3"], "A version is a number"),
        (["--registry", str(ok), "models", "alias", "k", "1", "7"], "cannot be a number"),
    ]
    for args, fragment in cases:
        out = _cli(*args)
        assert out.returncode == 1, (args, out.stderr)
        assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1, (args, out.stderr)
        assert fragment in out.stderr, (args, out.stderr)


# ---------------------------------------------------------------- 10. predict
@pytest.mark.parametrize(
    "payload,shown", [(None, "None (a NoneType)"), (3.5, "3.5 (a float)"), ("abc", "'abc' (a str)")]
)
def test_predict_names_a_payload_it_cannot_use(payload, shown):
    with pytest.raises(DataError, match=re.escape(f"`TinyNet.preprocess` cannot use the payload {shown}")):
        _model().predict(payload)


class _BrokenForward(TinyNet):
    def forward(self, x):
        return self.net(x[:, :2])  # a bug of the model's: its first layer takes 4 features


def test_predict_notes_the_payload_when_forward_fails():
    """A model's own error in `forward` stays its error (a wrong width is the input's: `DataError`, in
    test_inputs.py), with a note naming the payload."""
    model = _BrokenForward()
    model.input_signature = {"shape": [4], "dtype": "float32", "nonfinite": "warn"}  # the input is right
    with pytest.raises(RuntimeError) as info:
        model.predict([[1.0, 2.0, 3.0, 4.0]])
    assert any("payload [[1.0, 2.0, 3.0, 4.0]]" in note for note in info.value.__notes__)


def test_stale_writers_are_judged_by_pid_and_age(tmp_path, monkeypatch):
    old = tmp_path / f"put-elsewhere-{os.getpid()}-abcd"
    old.mkdir()
    os.utime(old, (time.time() - 2 * tmp.MAX_AGE_S,) * 2)
    assert tmp.collect(tmp_path, "put") == 1  # another host's folder, older than a day
    assert not old.exists()
