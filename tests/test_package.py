"""The package as a user installs it: the wheel built from this tree, installed into a bare virtual
environment with its core dependencies only (no extra), then imported, run and type-checked there."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import lane
import pytest

ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("torch", "tensorflow", "xgboost", "lightgbm", "pytorch_lightning", "transformers", "gymnasium")
#: Each backend's model class, and the extra its error must name.
EXTRAS = {
    "RayTorchModel": "torch",
    "RayLightningModel": "lightning",
    "RayTensorflowModel": "tensorflow",
    "RayXGBoostModel": "xgboost",
    "RayLightGBMModel": "lightgbm",
    "RayRLlibModel": "rllib",
    "RayTransformersModel": "transformers",
}


def _run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=540, cwd=cwd)


@lane.job("package", expected_s=35)
def _package(scratch: Path) -> tuple[Path, Path]:
    """The wheel, and the python of a new virtual environment holding it and what `pip install raymodel`
    brings with it (the development pins, so pip takes what its cache holds). No Ray: on the lane."""
    built = _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--wheel-dir", scratch, ROOT)
    assert built.returncode == 0, built.stderr
    (wheel,) = scratch.glob("raymodel-*.whl")
    venv = scratch / "venv"
    made = _run(sys.executable, "-m", "venv", "--without-pip", venv)
    assert made.returncode == 0, made.stderr
    python = venv / "bin" / "python"
    pip = (sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-compile")
    installed = _run(*pip, "--constraint", ROOT / "constraints.txt", wheel)
    assert installed.returncode == 0, installed.stderr[-3000:]
    return wheel, python


pytestmark = pytest.mark.lane("package")


@pytest.fixture
def wheel(lane) -> Path:
    return lane.result("package")[0]


@pytest.fixture
def bare(lane) -> Path:
    return lane.result("package")[1]


def test_the_wheel_holds_the_typed_package_and_nothing_else(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {name.split("/", 1)[0] for name in names}
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert tops == {"raymodel", f"raymodel-{version}.dist-info"}, tops
    assert "raymodel/py.typed" in names  # PEP 561: a user's type checker reads raymodel's annotations
    assert any(name.startswith("raymodel/web/static/") for name in names)  # the dashboard's page
    metadata = zipfile.ZipFile(wheel).read(f"raymodel-{version}.dist-info/METADATA").decode()
    for extra in EXTRAS.values():
        assert f"Provides-Extra: {extra}" in metadata


def test_imports_with_its_core_dependencies_alone(bare: Path) -> None:
    probe = f"""
import importlib.util, sys
from importlib import metadata
absent = [m for m in {FRAMEWORKS!r} if importlib.util.find_spec(m) is not None]
assert not absent, f"installed with the core dependencies: {{absent}}"
import raymodel as rm
assert rm.__version__ == metadata.version("raymodel"), rm.__version__
rm.TrainSettings(num_workers=2)
rm.data.from_numpy([[0.0, 1.0]] * 8, [0, 1] * 4)
print(rm.__version__, sorted(m for m in {FRAMEWORKS!r} if m in sys.modules))
"""
    ran = _run(bare, "-c", probe)
    assert ran.returncode == 0, ran.stderr
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert ran.stdout.split() == [version, "[]"]


def test_the_command_line_runs(bare: Path) -> None:
    ran = _run(bare.parent / "raymodel", "--help")
    assert ran.returncode == 0, ran.stderr
    for command in ("train", "tune", "serve", "jobs", "models", "server", "dashboard"):
        assert command in ran.stdout


def test_a_missing_framework_names_its_extra(bare: Path) -> None:
    probe = f"""
import raymodel as rm
for name, extra in {EXTRAS!r}.items():
    try:
        getattr(rm, name)
    except rm.MissingDependencyError as exc:
        assert f"pip install 'raymodel[{{extra}}]'" in str(exc), (name, str(exc))
        print(name, "->", extra)
    else:
        raise AssertionError(f"rm.{{name}} was given without its framework")
"""
    ran = _run(bare, "-c", probe)
    assert ran.returncode == 0, ran.stderr
    assert len(ran.stdout.splitlines()) == len(EXTRAS), ran.stdout


def test_a_users_type_checker_reads_the_installed_package(bare: Path, tmp_path: Path) -> None:
    """mypy, pointed at the bare environment, analyses the installed raymodel (without `py.typed` it
    stops at the import): the verbs' results, the settings' fields and the registry's reference."""
    (tmp_path / "user.py").write_text(
        """import raymodel as rm


class Net(rm.RayTorchModel):
    def setup(self, config: dict) -> None:
        self.width = int(config["hidden"])


model = Net(config={"hidden": 8})
settings = rm.TrainSettings(num_workers=2, num_epochs=3)
reveal_type(model.train(settings))
reveal_type(model.train(settings, wait=False))
reveal_type(model.tune(wait=False))
reveal_type(rm.registry.put(model, key="net"))
reveal_type(Net.from_checkpoint("ckpt"))
rm.TrainSettings(num_epoch=3)
"""
    )
    checked = _run(
        Path(sys.executable).parent / "mypy",
        "--python-executable",
        bare,
        "--no-incremental",
        "--follow-imports=silent",
        "user.py",
        cwd=tmp_path,
    )
    lines = [line.split(": ", 1)[1] for line in checked.stdout.splitlines() if line.startswith("user.py:")]
    assert lines == [
        'note: Revealed type is "raymodel.train._result.TrainResult"',
        'note: Revealed type is "raymodel.jobs._job.Job"',
        'note: Revealed type is "raymodel.jobs._job.Job"',
        'note: Revealed type is "raymodel.registry._registry.ModelRef"',
        'note: Revealed type is "user.Net"',
        'error: Unexpected keyword argument "num_epoch" for "TrainSettings"; did you mean "num_epochs"?  [call-arg]',
    ], checked.stdout
