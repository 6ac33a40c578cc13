"""RayRLlibModel: RLlib's new API stack from one class, on the session's real Ray and RLlib.

PPO learns CartPole with the user's own networks; the trained instance, its checkpoint, a registry
version and an HTTP route answer the same greedy actions without an Algorithm; a job streams, takes a
new lr and stops with a checkpoint; a killed Algorithm actor resumes from its newest checkpoint; ASHA
tunes over iterations; a Box action space trains and serves; bad input fails before Ray is touched.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import requests
import torch.nn as nn
from rl_models import Balancer, QuickBalancer, Swinger
from waiting import until

import raymodel as rm
from raymodel.contract import OwnRuns
from raymodel.exceptions import DataError, MissingDependencyError, ModelDefinitionError, SettingsError

OBS = [[0.0, 0.1, 0.02, -0.1], [0.01, -0.2, 0.15, 0.4], [0.0, 0.0, -0.2, -0.5]]


# ------------------------------------------------------------------ bad input, before any resource
class Misspelled(Balancer):
    algorithm = "PP0"


class QLearner(Balancer):
    algorithm = "DQN"


class NoEnv(rm.RayRLlibModel):
    def setup(self, config):
        self.pi = nn.Linear(4, 2)

    def forward(self, obs):
        return self.pi(obs)


class NoValue(NoEnv):
    def make_env(self, config):
        return Balancer().make_env(config)


class WrongWidth(Balancer):
    def setup(self, config):
        super().setup(config)
        self.pi = nn.Linear(4, 3)  # CartPole has 2 actions


@pytest.mark.parametrize(
    "model,error,fragment",
    [
        (Misspelled(), SettingsError, "`algorithm = 'PP0'` is not an RLlib algorithm. Did you mean 'PPO'?"),
        (QLearner(), SettingsError, "`algorithm = 'DQN'`: its RLlib module needs networks of another shape"),
        (NoEnv(), ModelDefinitionError, "must define `make_env`"),
        (NoValue(), ModelDefinitionError, "trains with PPO, an actor-critic algorithm: define `value(self, obs)`"),
        (WrongWidth(), ModelDefinitionError, "returns shape (1, 3) for one observation, but `WrongWidth.make_env`"),
    ],
)
def test_bad_models_fail_before_ray_naming_the_problem(no_ray, model, error, fragment):
    with pytest.raises(error) as caught:
        model.train({"num_epochs": 1})
    assert fragment in str(caught.value)


def test_data_given_to_an_rl_model_is_refused_naming_its_environment(no_ray):
    with pytest.raises(DataError, match=r"makes its own data \(`Balancer.make_env`\); leave `data=` out"):
        Balancer().train({"num_epochs": 1}, data={"train": ([[0.0]], [0])})


def test_a_missing_rllib_names_its_extra(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "gymnasium", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[rllib\]'"):
        Balancer().train({"num_epochs": 1})


def test_no_strategy_spreads_rllibs_one_learner(no_ray):
    """``strategy`` stays at its default for RLlib: no strategy spreads its one learner."""
    with pytest.raises(SettingsError, match=r"`strategy='fsdp'`: the rllib backend does not shard models"):
        Balancer().train({"num_epochs": 1, "strategy": "fsdp"})
    assert Balancer.backend.strategies == ()


def test_rllibs_runs_are_its_own_with_no_ray_train_trainer(no_ray):
    """RLlib's training is its own runs (``OwnRuns.make_run``): no Ray Train trainer or collective, what a
    run holds is the learner's CPU and one per env runner, and ``as_trainer`` says there is no trainer."""
    training = Balancer.backend.training
    assert isinstance(training, OwnRuns)
    assert not hasattr(training, "trainer") and not hasattr(training, "collective")
    assert training.needs(rm.TrainSettings(num_workers=2)) == {"CPU": 3.0}  # the learner's CPU, one per env runner
    with pytest.raises(ModelDefinitionError, match=r"not Ray Train runs .* there is no Ray Train trainer to give"):
        rm.Trainable(Balancer(), {"num_epochs": 1}, data=None).as_trainer()


# ------------------------------------------------------------------------------ on Ray and RLlib
# Learning (the greedy policy's return after 5 iterations), the checkpoint round trip, a crashed
# Algorithm actor's resume, ASHA, serving with a 422, the registry and `predict_batch` are the
# conformance suite's (the "rllib" case of tests/test_backends.py).
@pytest.mark.integration
def test_an_rl_job_streams_takes_a_new_lr_at_the_next_iteration_and_stops_with_a_checkpoint(ray_session):
    rm.jobs.release_pools()
    job = QuickBalancer().train({"num_workers": 0, "num_epochs": 50, "progress": False}, wait=False)
    rows = job.stream()
    first = next(iter(rows))
    assert first["epoch"] == 1 and first["lr"] == pytest.approx(3e-4)
    job.update(config={"lr": 1e-3})
    later = until(lambda: [r for r in job.history() if r.get("changes")], timeout=120)[0]
    assert later["changes"] == {"lr": 1e-3} and later["lr"] == pytest.approx(1e-3)
    assert job.changes[0]["config"] == {"lr": 1e-3}
    job.stop()
    result = job.wait(timeout=180)
    assert job.status == "STOPPED" and 2 <= len(result.history) < 50 and result.checkpoint is not None
    assert rm.RayModel.from_checkpoint(result.checkpoint).predict({"obs": OBS})["action"]


@pytest.mark.integration
@pytest.mark.beside  # mostly waits (an actor's kill and restart): the second session (tests/beside.py)
def test_a_killed_algorithm_actor_resumes_from_its_newest_checkpoint_each_iteration_once(ray_session):
    import ray

    rm.jobs.release_pools()
    job = QuickBalancer().train({"num_workers": 0, "num_epochs": 6, "max_failures": 1, "progress": False}, wait=False)
    until(lambda: len(job.history()) >= 2, timeout=180)
    named = ray.util.list_named_actors(all_namespaces=True)
    actor = [a for a in named if a["name"].startswith("raymodel-algorithm-")]
    assert len(actor) == 1, named
    # In the namespace of whichever process started the training server (not always this one).
    ray.kill(ray.get_actor(actor[0]["name"], namespace=actor[0]["namespace"]))
    result = job.wait(timeout=300)
    epochs = [row["epoch"] for row in result.history]
    assert epochs == [1, 2, 3, 4, 5, 6], epochs  # each iteration once: the restart went on from its checkpoint
    assert job.status == "SUCCEEDED"
    log = job.logs()
    assert "worker 0 failed after epoch" in log and "ActorDiedError" in log and "resumed" in log, log


def _algorithm_actors() -> list:
    from ray.util.state import list_actors

    return list_actors(filters=[("class_name", "=", "AlgorithmActor"), ("state", "=", "ALIVE")], detail=True)


@pytest.mark.integration
def test_a_jobs_runner_keeps_its_algorithm_actor_for_the_next_rl_job_which_trains_as_in_a_new_one(ray_session):
    """The next RL job's Algorithm is built in the actor of the one before (RLlib and torch imported, the
    process started: 2-3 s of a core each, then the next job's runner), kept idle holding no resources
    (a job's placement group holds its learner's CPU), and it trains exactly as in a new actor."""
    import ray

    rm.jobs.release_pools()
    for actor in _algorithm_actors():  # kept by an earlier test's job: the first job here starts a new one
        ray.kill(ray.get_actor(actor.name, namespace=actor.ray_namespace))
    until(lambda: not _algorithm_actors(), timeout=60)
    settings = {"num_workers": 0, "num_epochs": 2, "progress": False}
    first = QuickBalancer().train(settings, wait=False).wait(timeout=300)  # a job: the server's runner runs it
    (kept,) = until(_algorithm_actors, timeout=60)  # alive after its job: kept, not ended
    assert not kept.required_resources, kept.required_resources  # idle, it holds no CPU
    second = QuickBalancer().train(settings, wait=False).wait(timeout=300)
    (again,) = _algorithm_actors()
    assert (again.actor_id, again.pid) == (kept.actor_id, kept.pid)  # the second job's Algorithm ran in it
    keys = ("episode_return_mean", "env_steps_total", "loss", "policy_loss", "vf_loss")
    for one, two in zip(first.history, second.history, strict=True):
        assert {k: one[k] for k in keys} == pytest.approx({k: two[k] for k in keys}, rel=1e-6), (one, two)


@pytest.mark.integration
def test_a_server_warmed_for_rllib_starts_the_algorithms_actor_before_any_rl_job_asks(ray_session):
    """``--warm rllib`` (``rm.init(warm="rllib")``): the server's next job runner starts an Algorithm actor
    at once, holding no resources; the first RL job's Algorithm is built in it."""
    import ray

    server = rm.jobs.server()
    for actor in _algorithm_actors():  # kept by an earlier test's job
        ray.kill(ray.get_actor(actor.name, namespace=actor.ray_namespace))
    until(lambda: not _algorithm_actors(), timeout=60)
    try:
        ray.get(server.warm.remote([("rllib", 0)]))
        (ahead,) = until(_algorithm_actors, timeout=60)  # before any job: started by the spare runner
        assert not ahead.required_resources, ahead.required_resources
        job = QuickBalancer().train({"num_workers": 0, "num_epochs": 1, "progress": False}, wait=False)
        job.wait(timeout=300)
        (ran,) = _algorithm_actors()
        assert ran.actor_id == ahead.actor_id  # the job's Algorithm was built in it
    finally:
        ray.get(server.warm.remote([]))  # the session's: nothing warm


@pytest.mark.parametrize("env_runners", [0, 1, 2])
def test_a_trial_holds_the_bundles_rllib_asks_for_its_algorithm_and_env_runners(ray_session, env_runners):
    """A trial's placement group is RLlib's own request (``Algorithm.default_resource_request``): the
    Algorithm's bundle, then one per env runner, which RLlib places by index (a trial of one bundle
    failed every env runner with 'placement group bundle index 1 is invalid'). ``as_trainable`` joins
    Ray: the session's (a Ray of its own, started here, outlived the session and failed its exit)."""
    from ray.rllib.algorithms.ppo import PPO

    from raymodel.backends.rllib._loop import algo_config, env_name

    model = Balancer()
    tunable = rm.Tunable(model, {}, settings=rm.TuneSettings(train={"num_workers": env_runners}), data=None)
    ours = tunable.as_trainable()._resources({})
    settings = rm.TrainSettings(num_workers=env_runners)
    rllib = PPO.default_resource_request(algo_config(model, settings, env_name(model)))
    assert ours.bundles == [{k: v for k, v in b.items() if v} for b in rllib.bundles], (ours.bundles, rllib.bundles)
    assert tunable.trial_needs == {"CPU": 1.0 + env_runners}
    assert not tunable.trials_on_pools


@pytest.mark.integration
def test_a_box_action_space_trains_and_serves_a_continuous_action(ray_session):
    rm.jobs.release_pools()
    model = Swinger()
    result = model.train({"num_workers": 0, "num_epochs": 2, "progress": False})
    assert [row["epoch"] for row in result.history] == [1, 2]
    reported = {"episode_return_mean", "episode_len_mean", "env_steps", "loss", "policy_loss", "vf_loss", "time_s"}
    assert reported | {"lr"} <= set(result.history[-1]), result.history[-1]
    obs = [[1.0, 0.0, 0.0], [0.0, 1.0, -1.0]]
    action = model.predict({"obs": obs})["action"]
    assert len(action) == 2 and all(len(a) == 1 and -2.0 <= a[0] <= 2.0 for a in action)  # Pendulum's Box
    served = model.serve("/swinger")
    try:
        answer = requests.post(served.url, json={"obs": obs}, timeout=30)
        assert answer.status_code == 200 and answer.json() == {"action": action}
        missing = requests.post(served.url, json={"obs": [[None, 0.0, 0.0]]}, timeout=30)
        assert missing.status_code == 422 and "NaN" in missing.text, missing.text  # no env observes a NaN
    finally:
        served.shutdown()


def test_rllibs_private_api_is_used_in_one_module_only():
    """Outside ``backends/rllib/_private.py`` (which names the RLlib version and the public API that is
    missing) the plug-in reaches RLlib's objects only by their public names: no ``obj._name``."""
    import re

    from raymodel.backends import rllib

    folder = Path(rllib.__file__).parent
    found = {
        (path.name, chain)
        for path in folder.glob("*.py")
        if path.name != "_private.py"
        for line in path.read_text().splitlines()
        if not line.lstrip().startswith(("from ", "import "))
        for chain in re.findall(r"[A-Za-z_][\w.]*\._[a-z]\w*", line)
        if not _own(chain.split("."))
    }
    assert not found, found
    assert "Ray 2.60" in (folder / "_private.py").read_text()


def _own(parts: list[str]) -> bool:
    """``self._x`` or ``model._x`` (raymodel's own attributes), a raymodel module, or ``torch._dynamo`` (the
    name of torch's module that an optimizer's first step imports, imported ahead): not RLlib's."""
    own = parts[0] in ("self", "model") and len(parts) == 2
    return own or parts[0] == "raymodel" or parts == ["torch", "_dynamo"]
