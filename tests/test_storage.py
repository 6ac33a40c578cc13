"""Storage anywhere: every artifact location may be a URI, on a real S3-compatible server (moto)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import lane
import numpy as np
import pytest
from conformance import attempts, recorded
from models import FailOnce, Recorder, TinyNet
from s3server import S3Server

import raymodel as rm
from raymodel._internal import storage
from raymodel.exceptions import CheckpointError

TESTS = str(Path(__file__).parent)
TRIAL = {"resources_per_worker": {"CPU": 0.95}, "progress": False}


@pytest.fixture(scope="module")
def s3():
    with S3Server() as server:
        yield server


def _model(seed: int = 0) -> TinyNet:
    import torch

    torch.manual_seed(seed)
    model = TinyNet(config={"tag": seed})
    model.ensure_setup()
    return model


# ------------------------------------------------------------- locations
def test_joins_keep_a_uris_scheme_and_query():
    uri = "s3://b/runs?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join(uri, "exp", "trial/") == "s3://b/runs/exp/trial?endpoint_override=127.0.0.1:9000&scheme=http"
    assert storage.join("/tmp/runs/", "a") == "/tmp/runs/a"
    # Ray hands back paths on the filesystem (no scheme); rebased, they name the same place again.
    assert storage.rebase(uri, "b/runs/exp/checkpoint_1") == storage.join(uri, "exp", "checkpoint_1")
    assert storage.rebase("/tmp/runs", "/tmp/runs/x") == "/tmp/runs/x"
    with pytest.raises(ValueError, match="not under"):
        storage.rebase(uri, "other/runs/x")


def test_save_and_load_a_model_at_a_uri(s3, tiny):
    X, _ = tiny
    model = _model(3)
    location = model.save(s3.uri("saved/tiny"))
    assert location == s3.uri("saved/tiny")
    assert sorted(k.rsplit("/", 1)[-1] for k in s3.keys("saved/tiny/"))[-1] == "raymodel.json"
    again = rm.RayModel.from_checkpoint(location)
    np.testing.assert_allclose(again.predict(X), model.predict(X), rtol=1e-6)
    with pytest.raises(CheckpointError, match="already exists"):
        model.save(location)
    # A folder whose upload never finished (no manifest) is not a checkpoint.
    s3.client().put_object(Bucket="models", Key="half/class.pkl", Body=b"x")
    with pytest.raises(CheckpointError, match="raymodel.json"):
        rm.RayModel.from_checkpoint(s3.uri("half"))


# ------------------------------------------------------ registry on S3
PUTTER = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import torch, raymodel as rm
    from models import TinyNet
    torch.manual_seed(int(sys.argv[1]))
    model = TinyNet(config={{"tag": int(sys.argv[1])}})
    model.ensure_setup()
    registry = rm.registry.open(sys.argv[2])
    print(registry.put(model, key="shared").version, flush=True)
    registry.set_alias("shared", f"alias{{sys.argv[1]}}", 1)
""")


def test_a_registry_versions_location_on_s3_keeps_the_query_last_and_loads(s3, tiny):
    """Where a release's gate reads its ``against`` version from: the URI's query after the path."""
    X, _ = tiny
    model = _model(5)
    reg = rm.registry.open(s3.uri("located"))
    reg.put(model, key="tiny")
    location = reg.location("tiny", 1)
    assert location == s3.uri("located/tiny/versions/1"), location
    np.testing.assert_allclose(rm.RayModel.from_checkpoint(location).predict(X), model.predict(X), rtol=1e-6)


def test_eight_concurrent_s3_puts_and_alias_updates_are_all_kept(s3, tmp_path):
    uri = s3.uri("race-registry")
    script = tmp_path / "put.py"
    script.write_text(PUTTER.format(tests=TESTS))
    procs = [
        subprocess.Popen([sys.executable, str(script), str(i), uri], stdout=subprocess.PIPE, text=True)
        for i in range(8)
    ]
    versions = sorted(int(p.communicate(timeout=180)[0].strip()) for p in procs)
    assert versions == list(range(1, 9)), "two writers got the same version"
    registry = rm.registry.open(uri)
    tags = sorted(registry.get("shared", v).config["tag"] for v in versions)  # each whole, checksums verified
    assert tags == list(range(8))
    assert {a for r in registry.list("shared") for a in r.aliases} == {f"alias{i}" for i in range(8)}


# --------------------------------------------------- runs and experiments on S3
@pytest.mark.integration
def test_a_run_on_s3_keeps_its_scheme_and_resumes_from_s3(ray_session, s3, tmp_path, tiny):
    X, y = tiny
    root = s3.uri("runs")
    model = TinyNet()
    settings = rm.TrainSettings(
        num_workers=1,
        num_epochs=3,
        max_failures=1,
        progress=False,
        storage_path=root,
        name="on-s3",
        callbacks=[FailOnce(str(tmp_path / "crashed"), epoch=2), Recorder(str(tmp_path))],
    )
    result = model.train(settings, data=rm.data.from_numpy(X, y))
    assert result.checkpoint == storage.join(root, "on-s3", "checkpoint_epoch_000003")
    assert result.path == storage.join(root, "on-s3")
    # The second attempt continued from epoch 1's checkpoint, read back from S3.
    assert (tmp_path / "crashed").exists()
    second = attempts(recorded(tmp_path, 0))[1]
    assert second[:5] == ["before_setup", "after_setup", "on_load_checkpoint", "before_fit", "before_epoch(2)"]
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    again = rm.RayModel.from_checkpoint(result.checkpoint)
    np.testing.assert_allclose(again.predict(X), model.predict(X), rtol=1e-6)


@pytest.mark.integration
def test_an_experiment_on_s3_resumes_where_it_stopped(ray_session, s3, tiny):
    from interrupt import StopAfter

    X, y = tiny
    data = rm.data.from_numpy(X, y, valid_fraction=0.25)
    space = {"lr": rm.tune.grid_search([0.01, 0.02, 0.03, 0.04])}
    settings = dict(
        num_samples=1,
        max_epochs=2,
        scheduler="fifo",
        name="resumable",
        max_concurrent_trials=1,
        train=TRIAL,
        storage_path=s3.uri("experiments"),
        progress=False,
    )
    first = TinyNet().tune(space, settings={**settings, "callbacks": [StopAfter(2)]}, data=data)
    done_first = first.dataframe()
    done_first = done_first[done_first["epochs"] == 2].set_index("trial_id")
    assert 2 <= len(done_first) < 4
    resumed = TinyNet().tune(space, settings=settings, data=data, resume=True)
    frame = resumed.dataframe().set_index("trial_id")
    assert resumed.num_trials == 4 and (frame["epochs"] == 2).all()
    for trial_id, row in done_first.iterrows():
        assert frame.loc[trial_id, "val_loss"] == row["val_loss"], "a finished trial was run again"
    assert resumed.best_checkpoint.startswith("s3://models/experiments/resumable/")
    assert rm.RayModel.from_checkpoint(resumed.best_checkpoint).config["lr"] == resumed.best_config["lr"]


# ---------------------------------------------------------------- multi-node
@lane.job("multinode", expected_s=190)
def _multinode(scratch: Path) -> tuple[dict, list[str], Path]:
    """The script's result, the bucket's keys after it, and the driver's HOME (on a server of its own)."""
    from clusters import run_script
    from s3server import free_port

    home = scratch / "driver-home"  # the driver's HOME: ~/.raymodel would be here
    home.mkdir()
    with S3Server() as s3:
        env = {"RAYMODEL_HOME": s3.uri("home"), "HOME": str(home)}
        (seen,) = run_script("multinode.py", [str(free_port())], env, timeout=510)
        return seen, s3.keys("home/"), home


@pytest.mark.integration
@pytest.mark.lane("multinode")
def test_train_tune_registry_and_serve_across_nodes_with_everything_on_s3(lane):
    """Its own process and Ray cluster (on the background lane): a head with no CPUs (the driver's node)
    and two worker nodes."""
    seen, stored, home = lane.result("multinode")

    assert seen["train_checkpoint"].startswith("s3://models/home/runs/")
    assert seen["tune_best"].startswith("s3://models/home/runs/") and seen["tune_path"].startswith("s3://")
    assert all(p.startswith("s3://models/home/runs/") for p in seen["trial_paths"])
    assert seen["status"] == 200 and len(seen["answer"]["digit"]) == 4 and seen["direct_status"] == 200
    first, second, after = seen["serve_checkpoints"]  # one serve checkpoint, replaced on redeploy, then gone
    assert len(first) == 1 and len(second) == 1 and first != second and after == []
    # Train workers, trials and replicas ran on the worker nodes, never on the driver's.
    assert len(seen["nodes"]) == 3 and seen["worker_nodes"] and seen["replica_nodes"]
    assert seen["head"] not in seen["worker_nodes"] + seen["replica_nodes"]
    # Everything went to S3: runs, the registry and the serve checkpoint (removed at shutdown).
    keys = [k for k in stored if not k.endswith("/")]  # not pyarrow's empty folder markers
    assert any(k.startswith("home/runs/") and k.endswith("raymodel.json") for k in keys)
    assert any(k.startswith("home/registry/digits/versions/1/") for k in keys)
    assert not any(k.startswith("home/serve/") for k in keys), "the serve checkpoint was not removed"
    assert not (home / ".raymodel").exists(), sorted(str(p) for p in (home / ".raymodel").rglob("*"))
    # Room for warm pools of 2 and 1 workers: the second started once the first was ready, and a job of
    # each size took its own.
    sizes = seen["two_sizes"]
    assert sizes["started"] == 1 and sizes["first"] == [[2, "starting"]], sizes
    assert sizes["took_own"] == {"1": True, "2": True} and sizes["after"] == [[1, True, 1], [2, True, 1]], sizes
    local = [str(p) for p in home.rglob("*") if p.is_file()]
    assert not [p for p in local if "checkpoint" in p or "registry" in p or "raymodel.json" in p], local


def test_the_training_servers_records_payloads_and_arrays_on_s3(s3, monkeypatch):
    """A server whose home is a bucket keeps what a restart needs there: each record (one PUT, whole),
    the payload, and a job's arrays as .npy objects; a done job's folder is pruned."""
    import numpy as np

    from raymodel.jobs import _store
    from raymodel.jobs._prune import DEFAULTS, prune

    monkeypatch.setenv("RAYMODEL_HOME", s3.uri("server-home"))  # its own: another test runs jobs at "home"
    record = {"id": "train-1", "status": "PENDING", "submitted": 1.0, "history": []}
    _store.save_record(record)
    _store.save_payload("train-1", b"payload", {"key": "torch/1x[CPU=1]"})
    X = np.arange(600_000, dtype=np.float32).reshape(-1, 4)
    stored = _store.write_array(storage.join(_store.folder("train-1"), "data", "train-x.npy"), X)
    assert [r["id"] for r in _store.load_records()] == ["train-1"]
    assert _store.load_payload("train-1") == (b"payload", {"key": "torch/1x[CPU=1]"})
    assert np.array_equal(_store.load_array(stored), X)
    assert prune(set(), {"train-1"}, DEFAULTS)["jobs"] == 1  # done: its folder goes, its record stays
    assert [k for k in s3.keys("server-home/jobs/") if not k.endswith("/")] == ["server-home/jobs/train-1.json"]
    assert _store.load_payload("train-1") is None


def test_an_array_goes_to_s3_from_its_own_memory_and_is_read_back_in_one_read(s3):
    """A client off the cluster writes its arrays to S3 (a job's data): pyarrow's background writes
    queue each part until it is sent, a copy of the array in memory while it uploads (measured:
    +40 to +118 MB for 98 MB; sent part by part, +16 MB). In a process of its own, so that its peak
    memory is this write's."""
    from raymodel.jobs import _store

    script = textwrap.dedent(
        f"""
        import resource, numpy as np
        from raymodel._internal import storage
        from raymodel.jobs import _store
        _store.write_array({s3.uri("memory/warm.npy")!r}, np.zeros(1 << 20, dtype=np.float32))
        X = np.random.default_rng(0).random((800_000, 64), dtype=np.float32)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        stored = _store.write_array({s3.uri("memory/x.npy")!r}, X)
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        assert stored.shape == X.shape
        print(X.nbytes / 2**20, after - before)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    size_mb, grown_mb = map(float, out.stdout.split())
    assert size_mb > 190 and grown_mb < 0.15 * size_mb, out.stdout
    # Read back whole (as a job's runner loads its data), in one read of its size: read as a stream to
    # its end, the same file took 50 s of this process's time.
    began = time.monotonic()
    X = _store.load_array(_store.StoredArray(s3.uri("memory/x.npy"), (800_000, 64), "<f4"))
    assert time.monotonic() - began < 15
    assert np.array_equal(X, np.random.default_rng(0).random((800_000, 64), dtype=np.float32))
