"""Settings are validated, keyword-only, and fail before any Ray resource is taken."""

from __future__ import annotations

import pytest
from models import TinyNet

import raymodel as rm
from raymodel.exceptions import DataError, ModelDefinitionError, SettingsError


def test_defaults_and_dict_form_are_equivalent():
    assert rm.TrainSettings.coerce({"num_workers": 2}) == rm.TrainSettings(num_workers=2)
    assert rm.TrainSettings.coerce(None) == rm.TrainSettings()


def test_serves_port_defaults_to_raymodel_serve_port_else_8000(monkeypatch):
    monkeypatch.delenv("RAYMODEL_SERVE_PORT", raising=False)
    assert rm.ServeSettings().port == 8000
    monkeypatch.setenv("RAYMODEL_SERVE_PORT", "8123")
    assert rm.ServeSettings().port == 8123 and rm.ServeSettings(port=9000).port == 9000
    monkeypatch.setenv("RAYMODEL_SERVE_PORT", "eighty")
    with pytest.raises(SettingsError, match=r"`RAYMODEL_SERVE_PORT` must be a port number \(got 'eighty'\)"):
        rm.ServeSettings()


def test_unknown_key_suggests_the_right_one():
    with pytest.raises(SettingsError, match=r"no setting `num_worker`\. Did you mean `num_workers`\?"):
        rm.TrainSettings(num_worker=2)
    with pytest.raises(SettingsError, match="Did you mean `num_epochs`"):
        rm.TrainSettings.coerce({"num_epoch": 3})


def test_train_settings_fields_come_in_groups_the_error_and_the_docs_show():
    import dataclasses
    import re
    from pathlib import Path

    groups = rm.TrainSettings.GROUPS
    fields = [f.name for f in dataclasses.fields(rm.TrainSettings)]
    assert [n for members in groups.values() for n in members] == fields  # the class reads group by group
    with pytest.raises(SettingsError) as caught:
        rm.TrainSettings(prority=3)
    message = str(caught.value)
    assert "Did you mean `priority`?" in message
    assert "scheduling: `pool`, `priority`, `preemptible`, `resource_wait_s`" in message
    table = (Path(__file__).resolve().parent.parent / "docs" / "training.md").read_text()
    rows = dict(re.findall(r"^\| (\w+) \| ((?:`\w+`(?:, )?)+) \|", table, flags=re.M))
    assert {g: tuple(re.findall(r"`(\w+)`", r)) for g, r in rows.items()} == groups


def test_the_one_rule_for_pool_or_one_off():
    assert rm.TrainSettings(num_workers=2).on_pool
    assert not rm.TrainSettings(num_workers=2, pool=False).on_pool
    assert not rm.TrainSettings(num_workers=(1, 2)).on_pool  # elastic: Ray Train's own range, one-off
    assert not rm.TrainSettings(num_workers=0).on_pool  # this process


@pytest.mark.parametrize(
    "key,value,fragment",
    [
        ("num_workers", -1, "`num_workers` must be an int from 0 to 10000 (got -1)"),
        ("num_epochs", 0, "`num_epochs` must be an int from 1 to 1000000 (got 0)"),
        ("batch_size", 2.5, "`batch_size` must be an int from 1 to 16777216 (got 2.5)"),
        ("mode", "lowest", "`mode` must be one of 'min', 'max' (got 'lowest')"),
        ("use_gpu", "yes", "`use_gpu` must be True or False"),
        ("resources_per_worker", {"CPU": -1}, "`resources_per_worker` must be a dict"),
        ("callbacks", [object()], "`callbacks` must hold `raymodel.Callback` instances"),
        ("max_failures", -2, "`max_failures` must be an int from -1 to 10000"),
    ],
)
def test_bad_values_name_the_key_and_what_is_allowed(key, value, fragment):
    with pytest.raises(SettingsError) as info:
        rm.TrainSettings(**{key: value})
    assert fragment in str(info.value)


def test_all_problems_are_reported_together():
    with pytest.raises(SettingsError) as info:
        rm.TrainSettings(num_workers=0.5, num_epochs=-1)
    assert "`num_workers`" in str(info.value) and "`num_epochs`" in str(info.value)


def test_positional_arguments_are_refused():
    with pytest.raises(SettingsError, match="keyword arguments only"):
        rm.TrainSettings(2)


def test_bad_settings_fail_before_ray(no_ray, tiny):
    X, y = tiny
    with pytest.raises(SettingsError, match="num_epochs"):
        TinyNet().train({"num_epochs": 0}, data=rm.data.from_numpy(X, y))


@pytest.mark.parametrize(
    "data,fragment",
    [
        (None, "No data given"),
        ({"valid": None}, "no `train` split"),
        ({"train": ([[1.0, 2.0]] * 4, [0, 1, 0])}, "same number of rows"),
        ({"train": (["a", "b"], [0, 1])}, "must be numeric"),
        ({"tr": ([[1.0]], [0])}, "unknown split `tr`"),
        (iter([1, 2]), "one-shot iterator"),
        (42, "unsupported type `int`"),
    ],
)
def test_bad_data_fails_before_ray(no_ray, data, fragment):
    with pytest.raises(DataError, match=fragment):
        TinyNet().train({"num_epochs": 1}, data=data)


def test_a_model_missing_a_method_fails_before_ray(no_ray, tiny):
    class NoStep(rm.RayTorchModel):
        def setup(self, config):
            pass

        def configure_optimizers(self):
            pass

    X, y = tiny
    with pytest.raises(ModelDefinitionError, match="must define `train_step`"):
        NoStep().train({}, data=rm.data.from_numpy(X, y))


def test_a_routes_replicas_need_what_they_take_as_it_starts():
    from raymodel.serve._settings import replica_needs

    assert replica_needs(rm.ServeSettings()) == {"CPU": 1.0}  # Serve's default replica: 1 CPU
    assert replica_needs(rm.ServeSettings(num_replicas=3, ray_actor_options={"num_cpus": 0.5})) == {"CPU": 1.5}
    autoscaled = rm.ServeSettings(num_replicas="auto", min_replicas=2, ray_actor_options={"num_gpus": 1})
    assert replica_needs(autoscaled) == {"CPU": 2.0, "GPU": 2.0}
    assert replica_needs(rm.ServeSettings(num_replicas="auto", min_replicas=0)) == {}  # none until asked
    custom = rm.ServeSettings(ray_actor_options={"num_cpus": 0, "resources": {"accel": 1}})
    assert replica_needs(custom) == {"accel": 1.0}
