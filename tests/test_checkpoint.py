"""The checkpoint format: round trips, classes by value, checksums."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from models import TinyNet

import raymodel as rm
from raymodel.exceptions import CheckpointError, ChecksumError

PYTHON = sys.executable


def test_save_and_load_give_identical_predictions(tmp_path, tiny):
    X, _ = tiny
    model = TinyNet(config={"hidden": 5})
    path = model.save(tmp_path / "ckpt")
    manifest = json.loads((Path(path) / "raymodel.json").read_text())
    assert manifest["backend"] == "torch"
    assert manifest["config"]["hidden"] == 5
    assert {"python", "ray", "torch", "cloudpickle"} <= set(manifest["versions"])
    assert set(manifest["files"]) == {"class.pkl", "state/model.pt"}
    again = rm.RayModel.from_checkpoint(path)
    assert type(again).__name__ == "TinyNet" and again.config == model.config
    np.testing.assert_array_equal(np.array(again.predict(X)), np.array(model.predict(X)))


def test_a_process_looks_up_each_librarys_version_once_not_at_every_checkpoint(tmp_path):
    """A run writes a checkpoint every epoch: the installed versions its manifest records are read from
    the package metadata once per process (each lookup scans the environment: about 9 ms an epoch)."""
    import importlib.metadata

    from raymodel.contract import checkpoint as ckpt

    ckpt._installed_version.cache_clear()
    model = TinyNet()
    first = json.loads((Path(model.save(tmp_path / "a")) / "raymodel.json").read_text())["versions"]
    looked_up = ckpt._installed_version.cache_info().misses
    assert looked_up >= 3 and first["torch"] == importlib.metadata.version("torch")
    second = json.loads((Path(model.save(tmp_path / "b")) / "raymodel.json").read_text())["versions"]
    assert ckpt._installed_version.cache_info().misses == looked_up and second == first


def test_saving_over_a_non_empty_folder_is_refused(tmp_path):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(CheckpointError, match="already exists"):
        TinyNet().save(tmp_path / "taken")


def test_a_class_from_a_scripts_main_loads_in_a_fresh_process(tmp_path):
    script = tmp_path / "train_script.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys, numpy as np, torch, torch.nn as nn
        import raymodel as rm

        class ScriptNet(rm.RayTorchModel):
            def setup(self, config):
                torch.manual_seed(1)
                self.lin = nn.Linear(3, 2)
            def configure_optimizers(self):
                return torch.optim.SGD(self.lin.parameters(), lr=0.1)
            def train_step(self, batch):
                return self.lin(batch[0]).sum()
            def postprocess(self, output):
                return {"scores": output.tolist(), "from": "main"}

        model = ScriptNet()
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        print(json.dumps(model.predict(x)))
        model.save(sys.argv[1])
    """)
    )
    ckpt = tmp_path / "ckpt"
    made = subprocess.run([PYTHON, str(script), str(ckpt)], capture_output=True, text=True, check=True)
    loader = tmp_path / "load.py"  # a different process that never saw ScriptNet's source
    loader.write_text(
        textwrap.dedent("""
        import json, sys, numpy as np
        import raymodel as rm
        model = rm.RayModel.from_checkpoint(sys.argv[1])
        print(type(model).__name__)
        print(json.dumps(model.predict(np.arange(6, dtype=np.float32).reshape(2, 3))))
    """)
    )
    loaded = subprocess.run([PYTHON, str(loader), str(ckpt)], capture_output=True, text=True, check=True)
    name, prediction = loaded.stdout.strip().splitlines()[-2:]
    assert name == "ScriptNet"
    assert json.loads(prediction) == json.loads(made.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("victim", ["state/model.pt", "class.pkl"])
def test_a_tampered_file_is_refused_before_anything_is_unpickled(tmp_path, victim):
    path = Path(TinyNet().save(tmp_path / "ckpt"))
    # Garbage that would raise an UnpicklingError if it were ever unpickled.
    (path / victim).write_bytes(b"not a pickle at all")
    with pytest.raises(ChecksumError, match=f"Checksum mismatch for `{victim}`"):
        rm.RayModel.from_checkpoint(path)


def test_a_folder_without_manifest_is_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="is not a raymodel checkpoint"):
        rm.RayModel.from_checkpoint(tmp_path)
    path = Path(TinyNet().save(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match=r"is a file; a checkpoint is a folder \(it is `raymodel.json`: pass its"):
        rm.RayModel.from_checkpoint(path / "raymodel.json")
    with pytest.raises(CheckpointError, match="is a file; a checkpoint is a folder. Pass the folder"):
        rm.RayModel.from_checkpoint(path / "class.pkl")


def test_loading_through_the_wrong_subclass_is_refused(tmp_path):
    path = TinyNet().save(tmp_path / "ckpt")

    class Other(rm.RayTorchModel):
        pass

    with pytest.raises(CheckpointError, match="not a `Other`"):
        Other.from_checkpoint(path)


def test_pickling_by_value_finds_the_submodules_cloudpickles_own_scan_finds():
    """cloudpickle scans all of sys.modules for every function it pickles by value (about 7 ms for a small
    torch model class, at submit and at every checkpoint); raymodel's dumps reads an index instead. Its
    answer is cloudpickle's, module for module and in order, for every function of these modules."""
    import concurrent.futures
    import types

    import cloudpickle
    import models
    import torch.nn.functional
    from cloudpickle.cloudpickle import _extract_code_globals

    from raymodel._internal import serialization

    modules = (torch.nn.functional, torch.nn.modules.module, models, json, concurrent.futures.thread)
    functions = [f for m in modules for f in vars(m).values() if isinstance(f, types.FunctionType)]
    functions += [f for c in (TinyNet, rm.RayTorchModel) for f in vars(c).values() if isinstance(f, types.FunctionType)]
    reaching = 0
    with serialization._indexed_modules():
        for func in functions:
            deps = [func.__globals__[n] for n in _extract_code_globals(func.__code__) if n in func.__globals__]
            expected = serialization._scan_all(func.__code__, deps)
            assert serialization._submodules(func.__code__, deps) == expected, func.__qualname__
            reaching += bool(expected)
    assert reaching >= 10  # the comparison covered functions that do reach submodules
    assert cloudpickle.cloudpickle._find_imported_submodules is serialization._submodules  # what pickling calls
    # The whole class, pickled by value: the same bytes as with cloudpickle's own scan (outside `dumps`).
    with serialization.by_value(TinyNet):
        plain = cloudpickle.dumps(TinyNet)
    assert serialization.dumps(TinyNet, TinyNet) == plain


def test_a_module_imported_after_one_pickle_is_found_by_the_next():
    """The index of sys.modules is made again after an import: a function that reaches a submodule
    imported between two pickles carries it in the second."""
    import types

    from raymodel._internal import serialization

    package = types.ModuleType("raymodel_probe")
    package.__package__ = "raymodel_probe"
    space = {"raymodel_probe": package}
    exec(compile("def reach():\n    return raymodel_probe.sub.value\n", "<test>", "exec"), space)
    reach = space["reach"]
    sys.modules["raymodel_probe"] = package
    try:
        with serialization._indexed_modules():
            before = serialization._submodules(reach.__code__, [package])
            sub = sys.modules["raymodel_probe.sub"] = types.ModuleType("raymodel_probe.sub")
            after = serialization._submodules(reach.__code__, [package])
            del sys.modules["raymodel_probe.sub"]
            gone = serialization._submodules(reach.__code__, [package])
    finally:
        sys.modules.pop("raymodel_probe", None)
        sys.modules.pop("raymodel_probe.sub", None)
    assert (before, after, gone) == ([], [sub], [])
