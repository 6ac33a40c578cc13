"""RayTransformersModel: Hugging Face's Trainer from one class, on the session's real Ray.

A tiny BERT (built from a config, a tokenizer made in code) learns a generated sentiment set on two
workers from a `DatasetDict`, one row per epoch with the Trainer's evaluation; its `save_pretrained`
folder loads in plain transformers and predicts the same; a checkpoint, a registry version and an
HTTP route answer text (a 4xx for what is not text); a tiny GPT-2 generates and streams its tokens as
server-sent events; a job streams, takes a new lr and stops; bad input fails before Ray is touched.
A crashed worker's resume, ASHA over two-worker trials, `predict_batch` and the checkpoint round trip
are the conformance suite's ("transformers" in tests/test_backends.py).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pandas as pd
import pytest
import requests
import shared_runs
from hf_models import POEMS, Poet, Sentiment, Writer, sentiment_data, sentiment_rows, story_rows
from waiting import until

import raymodel as rm
from raymodel.exceptions import DataError, MissingDependencyError, ModelDefinitionError

TWO = {"num_workers": 2, "num_epochs": 3, "batch_size": 16, "progress": False}
TEXTS = ["a good day and a great film", "the food was awful and sad", "it is very nice", "we saw a grim dark film"]
EXPECTED = [1, 0, 1, 0]


# ------------------------------------------------------------------ bad input, before any resource
class NoModel(rm.RayTransformersModel):
    def setup(self, config):
        self.tokenizer = None  # and no self.model


class ExtraColumns(Sentiment):
    def tokenize(self, batch):
        return {**super().tokenize(batch), "pixels": [[0.0]] * len(batch["text"])}


def test_a_model_without_a_pretrained_model_fails_before_ray(no_ray):
    with pytest.raises(ModelDefinitionError, match=r"`NoModel.setup` must assign `self.model`, a transformers"):
        NoModel().train(TWO, data=sentiment_rows(8))


def test_tokenize_columns_the_model_does_not_take_are_named(no_ray):
    with pytest.raises(ModelDefinitionError) as caught:
        ExtraColumns().train(TWO, data=sentiment_rows(8))
    message = str(caught.value)
    assert "`ExtraColumns.tokenize` returned ['pixels']" in message
    assert "`BertForSequenceClassification.forward` does not take" in message and "'input_ids'" in message


def test_a_classifier_needs_a_label_column(no_ray):
    with pytest.raises(DataError, match=r"The `train` split has no label column \(columns: \['text'\]\)"):
        Sentiment().train(TWO, data={"text": ["a good day", "a bad day"]})


def test_data_that_is_no_dataset_frame_or_columns_is_refused(no_ray):
    with pytest.raises(DataError, match=r"`data` is a ndarray; the transformers backend trains on a `datasets"):
        Sentiment().train(TWO, data=np.zeros((4, 3)))
    with pytest.raises(DataError, match=r"the columns differ in length \(\{'text': 2, 'label': 1\}\)"):
        Sentiment().train(TWO, data={"text": ["a", "b"], "label": [1]})
    with pytest.raises(DataError, match=r"`data\['valid'\]` has no rows"):
        Sentiment().train(TWO, data={"train": sentiment_rows(4), "valid": {"text": [], "label": []}})


def test_missing_transformers_names_its_extra(no_ray, monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # as if not installed
    with pytest.raises(MissingDependencyError, match=r"pip install 'raymodel\[transformers\]'"):
        Sentiment().train(TWO, data=sentiment_rows(8))


def test_every_form_of_text_data_is_tokenized_once(no_ray):
    import datasets

    model = Sentiment()
    rows = sentiment_rows(16)
    forms = {
        "dict of columns": rows,
        "DataFrame": pd.DataFrame(rows),
        "Dataset": datasets.Dataset.from_dict(rows),
        "DatasetDict": datasets.DatasetDict({"train": datasets.Dataset.from_dict(rows)}),
    }
    for form, data in forms.items():
        spec = model.backend.prepare_data(model, data)
        train = spec.splits["train"].dataset
        assert sorted(train.column_names) == ["attention_mask", "input_ids", "label"], form
        assert len(train) == 16 and len(train[0]["input_ids"]) == 16 and train["label"] == rows["label"], form
    same = datasets.Dataset.from_dict(rows)
    first = model.backend.prepare_data(model, {"train": same, "validation": same})
    assert set(first.splits) == {"train", "valid"}
    again = model.backend.prepare_data(model, {"train": same})  # tokenized once: the cached dataset
    assert again.splits["train"].dataset is first.splits["train"].dataset


def test_text_is_taken_as_the_user_holds_its_column():
    """A datasets Column, a pandas Series or a numpy array of strings is a list of texts to predict."""
    from raymodel.backends.transformers._text import texts

    data = sentiment_data(4, 4)["validation"]
    expected = list(data["text"])
    for column in (data["text"], pd.Series(expected), np.asarray(expected), tuple(expected)):
        assert texts({"text": column}) == expected, type(column)
    with pytest.raises(TypeError, match=r"`text\[0\]` must be a string"):
        texts({"text": np.zeros((2, 3))})


def test_the_driver_sets_a_model_up_for_its_data_with_the_runs_seed(no_ray):
    """The driver sets a transformers model up to tokenize with its tokenizer, and the run starts from
    those weights: they follow the run's seed, not whatever the process's generator held, which is
    left as it was (a used pool trained another model than a fresh one before this)."""
    import torch

    from raymodel.train import prepare

    def first_weights(process_seed: int, seed: int) -> torch.Tensor:
        torch.manual_seed(process_seed)
        model = Sentiment()
        prepare(model, {"seed": seed}, sentiment_data(16, 8))
        after = torch.rand(1)
        torch.manual_seed(process_seed)
        assert torch.equal(after, torch.rand(1)), "the process's generator moved"
        return next(model.model.parameters()).detach().clone()

    assert torch.equal(first_weights(1, seed=3), first_weights(2, seed=3))
    assert not torch.equal(first_weights(1, seed=3), first_weights(1, seed=4))


def test_what_is_not_text_is_a_data_error_naming_what_is_expected(no_ray):
    model = Sentiment()
    assert set(model.predict({"text": "a good day"})) == {"label", "score"}
    for payload, fragment in [
        ({"pixels": [[0.1]]}, 'expected {"text": "..."}'),
        ({"text": [1, 2]}, "`text[0]` must be a string; got int 1"),
        ({"text": []}, "`text` must be a string or a non-empty list of strings"),
    ]:
        with pytest.raises(DataError, match=None) as caught:
            model.predict(payload)
        assert fragment in str(caught.value), (payload, str(caught.value))
    writer = Writer()
    with pytest.raises(DataError, match=r"`max_new_tokens` must be in \[1, 4096\]; got 0"):
        writer.predict({"prompt": "the good", "max_new_tokens": 0})
    with pytest.raises(DataError, match=r"unknown generation option\(s\) \['beams'\]"):
        writer.predict({"prompt": "the good", "beams": 2})
    with pytest.raises(ValueError, match=r"`BertForSequenceClassification` does not generate text"):
        model.stream({"prompt": "the good"})


# ------------------------------------------------------------------------------------- on Ray
def same(answer: dict, expected: dict) -> bool:
    """The same labels, and scores within float noise."""
    return answer["label"] == expected["label"] and np.allclose(answer["score"], expected["score"], atol=1e-5)


def rm_json(text: str) -> dict:
    import json

    return json.loads(text)


@pytest.mark.integration
def test_a_job_streams_takes_a_new_lr_at_the_next_epoch_and_stops_with_a_checkpoint(ray_session):
    import ray

    data = {"train": ray.data.from_pandas(pd.DataFrame(sentiment_rows(256))), "valid": pd.DataFrame(sentiment_rows(64))}
    job = Sentiment().train({**TWO, "num_epochs": 30}, data=data, wait=False)
    first = next(iter(job.stream()))
    assert first["epoch"] == 1 and "val_accuracy" in first
    job.update(config={"lr": 1e-4})
    changed = until(lambda: [r for r in job.history() if r.get("changes")], timeout=120)[0]
    assert changed["changes"] == {"lr": 1e-4} and job.changes[0]["config"] == {"lr": 1e-4}
    job.stop()
    result = job.wait(timeout=180)
    assert job.status == "STOPPED" and 2 <= len(result.history) < 30 and result.checkpoint is not None
    assert rm.RayModel.from_checkpoint(result.checkpoint).predict({"text": TEXTS})["label"]


class PauseAt(rm.Callback):
    """Sleeps at the start of epoch `epoch` (on every worker), after the previous epoch's row is out."""

    def __init__(self, epoch: int, seconds: float) -> None:
        self.epoch, self.seconds = epoch, seconds

    def before_epoch(self, epoch):
        if epoch == self.epoch:
            time.sleep(self.seconds)


@pytest.mark.integration
def test_more_epochs_asked_mid_run_go_on_with_a_stretched_schedule(ray_session):
    settings = {**TWO, "num_epochs": 2, "callbacks": [PauseAt(2, 3.0)]}
    job = Sentiment().train(settings, data=sentiment_data(256, 64), wait=False)
    assert next(iter(job.stream()))["epoch"] == 1
    job.update(settings={"num_epochs": 4})  # during epoch 2: the Trainer was built for 2 epochs
    result = job.wait(timeout=180)
    assert [row["epoch"] for row in result.history] == [1, 2, 3, 4] and job.status == "SUCCEEDED"
    assert result.history[2]["changes"] == {"num_epochs": 4}


# The tests that serve (a replica's CPU ends the idle pool) or run a one-off Ray Train run come after
# those that train on the module's pool: one cold pool fewer.
@pytest.mark.integration
def test_a_tiny_bert_learns_on_two_workers_and_its_weights_travel_everywhere(ray_session, registry, tmp_path):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    # The conformance suite's transformers case trains exactly this (TWO's settings, the same data).
    model, result, _ = shared_runs.once("conformance:transformers", lambda: shared_runs.sentiment(progress=False))
    assert [row["epoch"] for row in result.history] == [1, 2, 3]
    for row in result.history:
        assert {"loss", "val_loss", "val_accuracy"} <= set(row), row
    assert result.metrics["val_accuracy"] > 0.9, result.history
    expected = model.predict({"text": TEXTS})
    assert expected["label"] == EXPECTED and all(0.5 < s <= 1.0 for s in expected["score"])

    folder = model.save_pretrained(tmp_path / "sentiment")  # plain transformers, no raymodel
    plain = AutoModelForSequenceClassification.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    inputs = tokenizer(TEXTS, padding="max_length", truncation=True, max_length=16, return_tensors="pt")
    logits = plain(**inputs).logits.detach()
    assert logits.argmax(-1).tolist() == EXPECTED
    probs = logits.softmax(-1).max(-1).values.tolist()
    assert np.allclose(probs, expected["score"], atol=1e-5)
    assert same(Sentiment.from_pretrained(folder).predict({"text": TEXTS}), expected)

    assert same(rm.RayModel.from_checkpoint(result.checkpoint).predict({"text": TEXTS}), expected)
    rm.registry.put(model, key="sentiment")
    assert same(rm.registry.get("sentiment").predict({"text": TEXTS}), expected)
    served = model.serve("/sentiment")
    try:
        answer = requests.post(served.url, json={"text": TEXTS}, timeout=30)
        assert answer.status_code == 200 and same(answer.json(), expected)
        for payload in ({"text": [[0.1, 0.2]]}, {"pixels": [[0.1]]}, [1, 2]):
            wrong = requests.post(served.url, json=payload, timeout=30)
            assert wrong.status_code == 422 and "text" in wrong.json()["detail"], wrong.text
        refused = requests.post(served.url, json={"text": "a good day", "stream": True}, timeout=30)
        assert refused.status_code == 422 and "does not generate text" in refused.text
        assert same(requests.post(served.url, json={"text": TEXTS}, timeout=30).json(), expected)
    finally:
        served.shutdown()


@pytest.mark.integration
@pytest.mark.beside  # mostly waits: in the second session, while this one computes (tests/beside.py)
def test_a_tiny_gpt2_generates_and_streams_its_tokens_as_server_sent_events(ray_session):
    writer = Writer()
    result = writer.train({**TWO, "pool": False}, data=story_rows(400))  # a one-off Ray Train run
    losses = [row["loss"] for row in result.history]
    assert len(losses) == 3 and losses[-1] < losses[0], losses
    answer = writer.predict({"prompt": "the good", "max_new_tokens": 4})
    words = answer["text"].split()
    assert 1 <= len(words) <= 4 and all(w in writer.tokenizer.get_vocab() for w in words), answer
    local = list(writer.stream({"prompt": "the good", "max_new_tokens": 4}))
    assert "".join(local) == answer["text"] and len(local) > 1, local  # words, not "goodday" nor one piece

    served = writer.serve("/writer")
    try:
        plain = requests.post(served.url, json={"prompt": "the good", "max_new_tokens": 4}, timeout=30)
        assert plain.status_code == 200 and plain.json() == answer
        with requests.post(
            served.url, json={"prompt": "the good", "max_new_tokens": 4, "stream": True}, stream=True, timeout=30
        ) as streamed:
            assert streamed.status_code == 200
            assert streamed.headers["content-type"].startswith("text/event-stream")
            events = [line for line in streamed.iter_lines(decode_unicode=True) if line]
        assert events[-1] == "data: [DONE]", events
        pieces = [rm_json(e.removeprefix("data: "))["token"] for e in events[:-1]]
        assert pieces == local, events  # one event per piece, as generated
        bad = requests.post(served.url, json={"prompt": 5, "stream": True}, timeout=30)
        assert bad.status_code == 422 and "`prompt` must be a string" in bad.text
    finally:
        served.shutdown()


def learned_poet() -> Poet:
    """A Poet whose greedy text is the poems' (accents, emoji): 150 steps of plain torch, in-process."""
    import torch

    poet = Poet()
    poet.ensure_setup()
    batch = poet.tokenizer(POEMS, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(poet.model.parameters(), lr=1e-2)
    poet.model.train()
    for _ in range(150):
        poet.model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    poet.model.eval()
    return poet


@pytest.mark.integration
def test_a_streamed_generation_joins_to_exactly_the_answer_on_a_byte_level_bpe_tokenizer(ray_session):
    """Characters that a byte-level BPE tokenizer splits over tokens (accents, emoji) stream whole:
    the pieces of ``model.stream`` and of the route's events join to the non-streamed greedy text
    (decoded token by token, the same text comes out as U+FFFD pairs)."""
    poet = learned_poet()
    request = {"prompt": "crème", "max_new_tokens": 40}
    answer = poet.predict(request)["text"]
    assert "brûlée" in answer and "🙂" in answer, answer  # characters of two and four bytes
    ids = poet.tokenizer(answer)["input_ids"]
    alone = "".join(poet.tokenizer.decode([i]) for i in ids)
    assert "\ufffd" in alone and alone != answer, alone  # what decoding each token alone gave
    local = list(poet.stream(request))
    assert "".join(local) == answer and len(local) > 2, local

    key = "sk-raymodel-own-api-0123"  # keys guard raymodel's own API as they guard OpenAI's (test_llm_serving)
    served = poet.serve("/poet", settings=rm.ServeSettings(api_keys=[key]))
    bearer = {"Authorization": f"Bearer {key}"}
    try:
        refused = requests.post(served.url, json=request, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"] == "unauthorized", refused.text
        assert refused.headers["www-authenticate"].startswith("Bearer")
        plain = requests.post(served.url, json=request, headers=bearer, timeout=30)
        assert plain.status_code == 200 and plain.json() == {"text": answer}, plain.text
        with requests.post(
            served.url, json={**request, "stream": True}, headers=bearer, stream=True, timeout=30
        ) as streamed:
            assert streamed.status_code == 200
            events = [line for line in streamed.iter_lines(decode_unicode=True) if line]
        assert events[-1] == "data: [DONE]", events
        pieces = [rm_json(e.removeprefix("data: "))["token"] for e in events[:-1]]
        assert "".join(pieces) == answer and pieces == local, events
        # prompts that arrive together are decoded together (the replica's engine), each as it is alone
        prompts = ["crème", "la fa", "smörg", "déjà vu", "garçon", "🙂"]
        want = [poet.predict({"prompt": p, "max_new_tokens": 30})["text"] for p in prompts]
        post = lambda p: requests.post(  # noqa: E731
            served.url, json={"prompt": p, "max_new_tokens": 30}, headers=bearer, timeout=60
        ).json()["text"]
        with ThreadPoolExecutor(len(prompts)) as pool:
            assert list(pool.map(post, prompts)) == want
        info = requests.get(served.url + "/info", headers=bearer, timeout=30).json()
        assert max(info["batch_sizes_seen"]) > 1, info
    finally:
        served.shutdown()
