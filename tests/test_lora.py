"""LoRA adapters on ``RayTransformersModel`` (``lora = rm.LoRA(...)``): what trains, what is saved, where
it loads, and what is refused before any Ray resource is taken."""

from __future__ import annotations

import sys
import warnings

import numpy as np
import pytest
import requests
import torch
from hf_models import PAIRS, POEMS, Bard, chat_rows, pair_rows, save_poet_base, taught

import raymodel as rm
from raymodel.backends.transformers import _lora
from raymodel.exceptions import CheckpointError, DataError, MissingDependencyError, ModelDefinitionError, SettingsError

pytest.importorskip("peft")

ONE = {"num_workers": 1, "num_epochs": 1, "batch_size": 8, "progress": False}
PROMPT = {"prompt": PAIRS[0][0], "max_new_tokens": 12}


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    """A GPT-2 base that has learned the poems, as a transformers folder."""
    return save_poet_base(tmp_path_factory.mktemp("base") / "poet")


def learned(base: str, steps: int = 60) -> Bard:
    """A ``Bard`` whose adapter has learned the answers to ``PAIRS`` (plain torch, in-process)."""
    return taught(Bard(config={"base": base}), PAIRS, steps)


def greedy(hf_model, tokenizer, prompt: str = PROMPT["prompt"], n: int = PROMPT["max_new_tokens"]) -> str:
    """The greedy text of a model loaded without raymodel, as raymodel generates it."""
    ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
    out = hf_model.eval().generate(
        ids, attention_mask=torch.ones_like(ids), pad_token_id=tokenizer.eos_token_id, max_new_tokens=n, do_sample=False
    )
    return tokenizer.decode(out[0, ids.shape[-1] :], skip_special_tokens=True)


def test_a_lora_declarations_alpha_defaults_to_twice_its_rank():
    assert rm.LoRA().resolved({}) == (8, 16.0)
    assert rm.LoRA(r=4, alpha=4).resolved({}) == (4, 4.0)
    assert rm.LoRA(target_modules="c_attn").target_modules == ("c_attn",)


def test_the_lora_keys_of_a_models_config_win_over_its_declaration():
    assert rm.LoRA(r=4).resolved({"lora_r": 16}) == (16, 32.0)  # alpha still twice the rank, the config's
    assert rm.LoRA(r=4).resolved({"lora_r": 2, "lora_alpha": 7}) == (2, 7.0)
    assert rm.LoRA().resolved({"lora_r": np.int64(4), "lora_alpha": np.float32(2)}) == (4, 2.0)  # a searcher's


def test_a_bad_lora_declaration_or_config_key_is_refused_naming_it():
    for bad, says in (
        ({"r": 0}, "rank is a whole number"),
        ({"alpha": -1}, "alpha is a number > 0"),
        ({"dropout": 1.5}, "dropout is a number in [0, 1)"),
        ({"target_modules": ()}, "name the modules to adapt"),
    ):
        with pytest.raises(SettingsError, match=says.replace("[", r"\[").replace(")", r"\)")):
            rm.LoRA(**bad)
    with pytest.raises(SettingsError, match="`lora_r=0`"):
        rm.LoRA().resolved({"lora_r": 0})


def test_only_the_adapter_trains_beside_gpt2s_conv1d_layers():
    bard = Bard()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bard.ensure_setup()
    # peft's call of a name transformers deprecated is not the user's to fix: not shown to them
    assert not [w for w in caught if "is_gradient_checkpointing" in str(w.message)], [str(w.message) for w in caught]
    trainable = [n for n, p in bard.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n and "c_attn" in n for n in trainable), trainable
    config = bard.model.peft_config["default"]
    assert config.fan_in_fan_out and config.r == 4 and config.lora_alpha == 8  # GPT-2's Conv1D: fan in, fan out

    class Default(Bard):
        lora = rm.LoRA(r=2)  # peft's default targets for GPT-2

    wide = Default(config={"lora_r": 3})
    wide.ensure_setup()
    assert set(wide.model.peft_config["default"].target_modules) == {"c_attn"}
    assert wide.model.peft_config["default"].r == 3


class NoSuchLayer(Bard):
    lora = rm.LoRA(target_modules=("q_proj",))


class NotPretrained(Bard):
    def setup(self, config):
        super().setup(config)
        self.model = torch.nn.Linear(2, 2)


class NoTemplate(Bard):
    def setup(self, config):
        super().setup(config)
        self.tokenizer.chat_template = None


@pytest.mark.parametrize(
    "model_class, data, error, says",
    [
        (
            NoSuchLayer,
            pair_rows(8),
            ModelDefinitionError,
            "targets `q_proj`, which `GPT2LMHeadModel` does not have; .*c_attn",
        ),
        (NotPretrained, pair_rows(8), ModelDefinitionError, "PreTrainedModel` \\(the base that `lora` adapts\\)"),
        (NoTemplate, chat_rows(8), DataError, "tokenizer has no chat template"),
        (Bard, {"prompt": ["a", "b"]}, DataError, "a `prompt` column but no `completion` column"),
        (Bard, {"messages": [[{"role": "user"}]]}, DataError, "each is a list of"),
        (Bard, {"label": [1, 2]}, DataError, "`prompt` and `completion` columns, or a chat `messages` column"),
    ],
)
def test_bad_adapter_input_is_named_before_ray(no_ray, model_class, data, error, says):
    with pytest.raises(error, match=says):
        model_class().train(ONE, data=data)


def test_an_answer_cut_off_by_max_length_is_named(no_ray):
    with pytest.raises(DataError, match="answer is cut off.*`max_length`"):
        Bard(config={"max_length": 3}).train(ONE, data=pair_rows(8))


def test_peft_missing_names_the_llm_extra(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[llm\]'"):
        Bard().train(ONE, data=pair_rows(8))


def test_prompt_completion_and_chat_data_label_only_the_answers():
    """The labelled tokens decode to exactly the answers (accents and emoji over several byte-level
    tokens), each ended by the end-of-sequence token; the prompts and the user's and system's turns are
    masked."""
    bard = Bard()
    bard.ensure_setup()
    eos = bard.tokenizer.eos_token

    def answers(rows):
        return [
            bard.tokenizer.decode([t for t, label in zip(ids, labels) if label != -100])
            for ids, labels in zip(rows["input_ids"], rows["labels"])
        ]

    short = Bard(config={"max_length": 5})
    short.ensure_setup()
    assert [len(ids) for ids in short.tokenize({"text": POEMS[:2]})["input_ids"]] == [5, 5]  # the config's, not 128
    pairs = bard.tokenize(pair_rows(4))
    assert answers(pairs) == [c + eos for _, c in PAIRS]
    assert all(
        len(i) == len(m) == len(lab)
        for i, m, lab in zip(*(pairs[k] for k in ("input_ids", "attention_mask", "labels")))
    )
    two_turns = [
        {"role": "system", "content": "réponds"},
        {"role": "user", "content": "dessert?"},
        {"role": "assistant", "content": "crème brûlée 🍰"},
        {"role": "user", "content": "encore?"},
        {"role": "assistant", "content": "déjà vu 🙂"},
    ]
    chat = bard.tokenize({"messages": [two_turns]})
    assert answers(chat) == [f"crème brûlée 🍰{eos}déjà vu 🙂{eos}"]
    rendered = bard.tokenizer.decode(chat["input_ids"][0])
    assert "u: dessert?" in rendered and "s: réponds" in rendered  # there, but not labelled

    bard.tokenizer.chat_template = "{% for m in messages|reverse %}{{ m['content'] }}{% endfor %}"
    with pytest.raises(DataError, match="does not render a conversation's turns as prefixes"):
        bard.tokenize({"messages": [two_turns]})


def test_an_adapter_saves_for_peft_merges_for_transformers_and_names_its_base_in_the_registry(base, registry, tmp_path):
    """Outside Ray: the adapter folder loads with plain peft and the merged one with plain transformers,
    both giving raymodel's greedy text; a registry version rebuilds the adapted model, and is refused
    on a base other than the one it names."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bard = learned(base)
    answer = bard.predict(PROMPT)["text"]
    untrained = Bard(config={"base": base}).predict(PROMPT)["text"]  # a new adapter changes nothing
    assert answer != untrained, answer

    folder = bard.save_pretrained(tmp_path / "adapter")
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json"} <= files
    assert "model.safetensors" not in files
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert greedy(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), folder), tokenizer) == answer
    merged = bard.save_pretrained(tmp_path / "merged", merged=True)
    assert not (tmp_path / "merged" / "adapter_config.json").exists()
    assert greedy(AutoModelForCausalLM.from_pretrained(merged), tokenizer) == answer
    assert bard.predict(PROMPT)["text"] == answer  # merging worked on a copy
    assert Bard.from_pretrained(folder, config={"base": base}).predict(PROMPT)["text"] == answer

    ref = rm.registry.put(bard, key="bard")
    named = rm.registry.list("bard")[-1].lineage["adapter_of"]
    assert named == {"fingerprint": _lora.base_fingerprint(bard.model), "base": base}
    assert rm.registry.get(ref).predict(PROMPT)["text"] == answer
    other = save_poet_base(tmp_path / "other", seed=4, steps=5)
    with pytest.raises(CheckpointError, match="an adapter only fits the base it was trained on") as refused:
        rm.registry.get(ref, config={"base": other})
    elsewhere = Bard(config={"base": other})
    elsewhere.ensure_setup()
    named, built = _lora.base_fingerprint(bard.model), _lora.base_fingerprint(elsewhere.model)
    assert named != built and named[:12] in str(refused.value) and built[:12] in str(refused.value)


@pytest.mark.integration
def test_an_adapter_learns_the_answers_on_two_workers_and_leaves_the_base_as_it_was(ray_session, base):
    """Prompt/completion pairs, then chat messages, on two workers (a pool): the answers' loss falls;
    the base's weights are bit for bit the folder's; a checkpoint holds the adapter (no weights of the
    base), which loads back to the same text."""
    from pathlib import Path

    from transformers import AutoModelForCausalLM

    settings = {"num_workers": 2, "num_epochs": 3, "batch_size": 8, "progress": False}
    bard = Bard(config={"base": base, "lr": 3e-2})
    result = bard.train(settings, data={"train": pair_rows(64), "valid": pair_rows(16)})
    losses = [row["val_loss"] for row in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0] - 0.5, losses

    plain = AutoModelForCausalLM.from_pretrained(base).state_dict()
    trained = {
        k.removeprefix("base_model.model.").replace(".base_layer", ""): v
        for k, v in bard.model.state_dict().items()
        if "lora_" not in k
    }
    assert set(plain) <= set(trained) and all(torch.equal(plain[k], trained[k]) for k in plain)

    folder = Path(result.checkpoint) / "state" / "hf"
    sizes = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert "adapter_model.safetensors" in sizes and _lora.BASE_FILE in sizes, sizes
    assert not [n for n in sizes if n.startswith("model") or n.endswith(".bin") and n != "training_args.bin"], sizes
    assert sizes["adapter_model.safetensors"] < 0.05 * (Path(base) / "model.safetensors").stat().st_size
    answer = bard.predict(PROMPT)["text"]
    assert rm.RayModel.from_checkpoint(result.checkpoint).predict(PROMPT)["text"] == answer

    chat = Bard(config={"base": base, "lr": 3e-2}).train(
        settings, data={"train": chat_rows(64), "valid": chat_rows(16)}
    )
    losses = [row["val_loss"] for row in chat.history]
    assert losses[-1] < losses[0] - 0.5, losses


@pytest.mark.integration
def test_an_adapter_job_streams_takes_a_new_lr_and_resumes_from_its_newest_checkpoint(ray_session, base, tmp_path):
    """A job of an adapted model as of any model: its rows stream, `update(lr)` lands at an epoch's start,
    and a worker that crashes in epoch 3 resumes from epoch 2's adapter checkpoint: each epoch once."""
    from models import FailOnce

    settings = {
        "num_workers": 2,
        "num_epochs": 4,
        "batch_size": 8,
        "max_failures": 1,
        "progress": False,
        "callbacks": [FailOnce(str(tmp_path / "crashed"), epoch=3)],
    }
    job = Bard(config={"base": base, "lr": 3e-2}).train(settings, data=pair_rows(64), wait=False)
    assert next(iter(job.stream()))["epoch"] == 1
    job.update(config={"lr": 1e-2})
    result = job.wait(timeout=300)
    assert (tmp_path / "crashed").exists() and job.status == "SUCCEEDED"
    assert [row["epoch"] for row in result.history] == [1, 2, 3, 4]
    assert [row["changes"] for row in result.history if row.get("changes")] == [{"lr": 1e-2}]
    assert rm.RayModel.from_checkpoint(result.checkpoint).model.peft_config["default"].r == 4


def test_a_classifier_trains_its_head_with_the_adapter():
    """peft's ``SEQ_CLS`` task: the new head of a sequence classifier trains beside the adapter."""
    from hf_models import Sentiment

    class Adapted(Sentiment):
        lora = rm.LoRA(r=2)  # peft's default targets for BERT: query, value

    model = Adapted()
    model.ensure_setup()
    trainable = {n for n, p in model.model.named_parameters() if p.requires_grad}
    assert any("lora_" in n and "query" in n for n in trainable) and any("classifier" in n for n in trainable)
    assert not any("word_embeddings" in n or "dense" in n and "lora_" not in n for n in trainable), trainable


@pytest.mark.integration
def test_an_adapter_job_stops_with_a_checkpoint_of_its_adapter_that_serves(ray_session, base):
    job = Bard(config={"base": base}).train({**ONE, "num_workers": 2, "num_epochs": 30}, data=pair_rows(64), wait=False)
    assert next(iter(job.stream()))["epoch"] == 1
    job.stop()
    result = job.wait(timeout=180)
    assert job.status == "STOPPED" and 1 <= len(result.history) < 30 and result.checkpoint is not None
    restored = rm.RayModel.from_checkpoint(result.checkpoint)
    fresh = Bard(config={"base": base})
    fresh.ensure_setup()
    assert _lora.is_adapted(restored.model) and restored.adapter_of == fresh.adapter_of
    answer = restored.predict(PROMPT)["text"]
    served = restored.serve("/bard")  # a replica: setup's base, then the adapter (its CPU ends the idle pool)
    try:
        reply = requests.post(served.url, json=PROMPT, timeout=60)
        assert reply.status_code == 200 and reply.json() == {"text": answer}, reply.text
    finally:
        served.shutdown()


@pytest.mark.integration
def test_asha_searches_the_adapters_rank(ray_session, base):
    space = {"lora_r": rm.tune.grid_search([2, 8])}
    settings = rm.TuneSettings(
        num_samples=1,
        max_epochs=2,
        grace_period=1,
        metric="val_loss",
        mode="min",
        train={"resources_per_worker": {"CPU": 0.95}, "batch_size": 8},
    )
    model = Bard(config={"base": base, "lr": 3e-2})
    result = model.tune(space, settings=settings, data={"train": pair_rows(32), "valid": pair_rows(8)})
    frame = result.dataframe()
    assert sorted(frame["config/lora_r"]) == [2, 8] and frame["val_loss"].notna().all()
    assert model.model.peft_config["default"].r == result.best_config["lora_r"]
