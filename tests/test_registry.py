"""The registry: versions, aliases, whole-or-nothing writes, integrity, S3, CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models import TinyNet

import raymodel as rm
from raymodel.exceptions import ChecksumError, RegistryError

PYTHON = sys.executable
TESTS = str(Path(__file__).parent)


def _model(seed: int) -> TinyNet:
    import torch

    torch.manual_seed(seed)
    model = TinyNet()
    model.ensure_setup()
    return model


def _three_versions() -> tuple[list[Any], list[Any]]:
    """Three versions of ``tiny`` (seeds 0-2, metadata ``{"seed": i}``), the second aliased ``production``:
    the models, and what ``put`` gave for each."""
    models = [_model(s) for s in range(3)]
    refs = [rm.registry.put(m, key="tiny", metadata={"seed": i}) for i, m in enumerate(models)]
    assert [(r.key, r.version) for r in refs] == [("tiny", 1), ("tiny", 2), ("tiny", 3)]
    rm.registry.set_alias("tiny", "production", 2)
    return models, refs


def test_every_form_of_a_reference_resolves_to_its_version(registry, tiny):
    X, _ = tiny
    models, refs = _three_versions()
    np.testing.assert_allclose(rm.registry.get("tiny").predict(X), models[2].predict(X))
    np.testing.assert_allclose(rm.registry.get("tiny", 1).predict(X), models[0].predict(X))
    np.testing.assert_allclose(rm.registry.get("tiny", "production").predict(X), models[1].predict(X))
    # get takes what put gives, and the references Servable takes
    for ref, n in ((refs[0], 0), ("tiny:1", 0), ("tiny@production", 1), ("tiny", 2)):
        np.testing.assert_allclose(rm.registry.get(ref).predict(X), models[n].predict(X))
    assert rm.registry.show(refs[1]).aliases == ["production"] and rm.registry.show("tiny@production").version == 2
    assert rm.registry.open(os.environ["RAYMODEL_REGISTRY"]).resolve("tiny@production") == 2
    records = rm.registry.list("tiny")
    assert [(r.version, r.aliases, r.metadata) for r in records] == [
        (1, [], {"seed": 0}),
        (2, ["production"], {"seed": 1}),
        (3, [], {"seed": 2}),
    ]


def test_a_reference_that_names_nothing_is_an_error_naming_what_exists(registry):
    _three_versions()
    with pytest.raises(RegistryError, match="'tiny:1' names its version already"):
        rm.registry.get("tiny:1", 2)
    with pytest.raises(RegistryError, match="what follows ':' must be a version number"):
        rm.registry.get("tiny:latest")
    with pytest.raises(RegistryError, match=r"No model `nope`.*Keys: tiny"):
        rm.registry.get("nope")
    with pytest.raises(RegistryError, match=r"no version 9; versions: 1, 2, 3"):
        rm.registry.get("tiny", 9)
    with pytest.raises(RegistryError, match=r"no alias `staging`; aliases: production->2"):
        rm.registry.get("tiny", "staging")


def test_a_deleted_version_takes_its_aliases_with_it(registry):
    models, _ = _three_versions()
    rm.registry.delete("tiny", 2)
    assert [r.version for r in rm.registry.list("tiny")] == [1, 3]
    with pytest.raises(RegistryError, match="no alias `production`"):  # went with its version
        rm.registry.get("tiny", "production")
    assert rm.registry.put(models[0], key="tiny", alias="production").version == 4
    rm.registry.remove_alias("tiny", "production")
    assert rm.registry.show("tiny", 4).aliases == []


def test_get_gives_the_version_with_the_config_overrides_it_is_given(registry):
    rm.registry.put(_model(7), key="roundtrip")
    assert rm.registry.get("roundtrip", config={"note": "x"}).config["note"] == "x"


def test_a_version_predicts_the_same_in_a_fresh_process(registry, tiny):
    X, _ = tiny
    model = _model(7)
    rm.registry.put(model, key="roundtrip")
    code = textwrap.dedent("""
        import json, sys, numpy as np
        import raymodel as rm
        model = rm.registry.get("roundtrip")
        print(json.dumps(model.predict(np.array(json.loads(sys.stdin.read()), dtype=np.float32))))
    """)
    out = subprocess.run(
        [PYTHON, "-c", code],
        input=json.dumps(X.tolist()),
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": ""},
    )
    np.testing.assert_allclose(json.loads(out.stdout.strip().splitlines()[-1]), model.predict(X), rtol=1e-6)


PUTTER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import torch, raymodel as rm
    from models import TinyNet
    torch.manual_seed(int(sys.argv[1]))
    model = TinyNet(config={{"tag": int(sys.argv[1])}})
    model.ensure_setup()
    if sys.argv[2] == "hang":  # stop right before the version is published, saying so (argv[3])
        import pathlib, raymodel.registry._store as store, time
        def hang(*a):
            pathlib.Path(sys.argv[3]).write_text(repr(a))
            time.sleep(600)
        store.os.rename = hang
    print(rm.registry.put(model, key="shared").version, flush=True)
""")


def test_eight_concurrent_puts_get_eight_whole_versions(registry, tmp_path):
    script = tmp_path / "put.py"
    script.write_text(PUTTER.format(tests=TESTS))
    procs = [subprocess.Popen([PYTHON, str(script), str(i), "go"], stdout=subprocess.PIPE, text=True) for i in range(8)]
    versions = sorted(int(p.communicate(timeout=120)[0].strip()) for p in procs)
    assert versions == list(range(1, 9))
    tags = sorted(rm.registry.get("shared", v).config["tag"] for v in versions)  # each whole and verified
    assert tags == list(range(8))


def test_a_process_killed_mid_put_leaves_no_visible_version(registry, tmp_path):
    rm.registry.put(_model(0), key="shared")
    script = tmp_path / "put.py"
    script.write_text(PUTTER.format(tests=TESTS))
    publishing = tmp_path / "publishing"
    proc = subprocess.Popen([PYTHON, str(script), "5", "hang", str(publishing)])
    staging = Path(registry.uri) / "shared" / ".staging"
    deadline = time.monotonic() + 60
    while not publishing.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert publishing.exists() and proc.poll() is None, "the writer never reached the version's publishing"
    assert any(staging.iterdir())  # the whole version is written, in staging, when the writer dies
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert [r.version for r in rm.registry.list("shared")] == [1]
    assert rm.registry.put(_model(1), key="shared").version == 2
    assert not any(staging.iterdir())  # the killed writer's staging folder was collected


def test_a_tampered_artifact_is_refused(registry):
    rm.registry.put(_model(0), key="t")
    victim = Path(registry.uri) / "t" / "versions" / "1" / "state" / "model.pt"
    victim.write_bytes(victim.read_bytes()[:-8] + b"tampered")
    with pytest.raises(ChecksumError, match="state/model.pt"):
        rm.registry.get("t")


def test_a_version_mismatch_warns_naming_the_versions(registry):
    rm.registry.put(_model(0), key="old")
    manifest = Path(registry.uri) / "old" / "versions" / "1" / "raymodel.json"
    data = json.loads(manifest.read_text())
    data["versions"]["torch"] = "1.0.0"  # as if written by another torch (a whole, consistent manifest)
    from raymodel.contract.checkpoint import manifest_digest

    data["manifest_sha256"] = manifest_digest(data)
    manifest.write_text(json.dumps(data))
    with pytest.warns(RuntimeWarning, match=r"torch 1\.0\.0 \(now 2\."):
        rm.registry.get("old")


@pytest.mark.integration
def test_lineage_of_a_train_result(ray_session, registry, tiny):
    X, y = tiny
    result = TinyNet().train({"num_workers": 0, "num_epochs": 2, "progress": False}, data=rm.data.from_numpy(X, y))
    ref = rm.registry.put(result, key="trained", alias="production")
    record = rm.registry.show("trained", "production")
    assert record.version == ref.version and record.aliases == ["production"]
    assert record.metrics["val_acc"] == result.metrics["val_acc"]
    assert record.lineage["run_path"] == result.path and record.lineage["config"]["hidden"] == 8
    cli = subprocess.run(
        [PYTHON, "-m", "raymodel.cli", "models", "show", "trained@production"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(cli.stdout)["lineage"]["epochs"] == 2


def _models_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "raymodel.cli", "models", *args], capture_output=True, text=True)


def test_the_cli_lists_the_alias_it_set(registry):
    rm.registry.put(_model(0), key="cli")
    rm.registry.put(_model(1), key="cli")
    assert _models_cli("alias", "cli", "1", "production").returncode == 0
    listing = _models_cli("list", "cli").stdout
    assert "production" in listing and listing.count("\ncli ") == 2
    assert rm.registry.show("cli", 1).aliases == ["production"]


def test_the_cli_shows_a_version_it_deleted_gone(registry):
    rm.registry.put(_model(0), key="cli")
    rm.registry.put(_model(1), key="cli")
    assert _models_cli("delete", "cli", "2").returncode == 0
    missing = _models_cli("show", "cli:2")
    assert missing.returncode == 1 and "no version 2; versions: 1" in missing.stderr


@pytest.fixture
def s3_uri(monkeypatch):
    """A real S3-compatible server (moto's server mode) on 127.0.0.1."""
    from s3server import ENV, S3Server

    for var, value in ENV.items():
        monkeypatch.setenv(var, value)
    with S3Server() as s3:
        yield s3.uri("registry")


def test_the_registry_works_on_an_s3_compatible_store(s3_uri, tiny):
    X, _ = tiny
    reg = rm.registry.open(s3_uri)
    a, b = _model(0), _model(1)
    assert reg.put(a, key="s3model").version == 1
    assert reg.put(b, key="s3model", alias="production").version == 2
    np.testing.assert_allclose(reg.get("s3model", "production").predict(X), b.predict(X))
    np.testing.assert_allclose(rm.registry.open(s3_uri).get("s3model", 1).predict(X), a.predict(X))
    assert [(r.version, r.aliases) for r in reg.list("s3model")] == [(1, []), (2, ["production"])]
    reg.delete("s3model", 1)
    assert [r.version for r in reg.list()] == [2]
