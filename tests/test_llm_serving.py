"""The OpenAI-compatible LLM server (``ServeSettings(api="openai")``), driven by the official ``openai``
client: completions, chat, streaming that joins to the same text on a byte-level BPE tokenizer,
batched generation, LoRA adapters on one base chosen by ``model``, keys; and, in-process, the
request checks and the engine's continuous batching."""

from __future__ import annotations

import glob
import json
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import requests
from hf_models import PAIRS, Bard, Chatty, save_poet_base, taught

import raymodel as rm
from raymodel.contract import TextRequest
from raymodel.exceptions import SettingsError
from raymodel.serve._llm import openai as _openai
from raymodel.serve._replica import auth as _auth

#: Serve's waits (steps, delays, replicas seen down): in a second session, beside the others (tests/beside.py).
pytestmark = pytest.mark.beside

KEY = "sk-raymodel-test-0123456789"
PROMPTS = ["crème", "la fa", "smörg", "déjà vu, entrée", "garçon, un", "à Zü", "🙂", "la façade du château"]
#: The adapters' lessons: the same questions, answered differently by each version.
LESSONS = [PAIRS, [(q, a) for (q, _), (_, a) in zip(PAIRS, PAIRS[1:] + PAIRS[:1])]]


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    return save_poet_base(tmp_path_factory.mktemp("base") / "poet")


@pytest.fixture(scope="module")
def chatty(base) -> Chatty:
    return Chatty(config={"base": base})


def greedy(model, prompt: str, n: int) -> str:
    return model.predict({"prompt": prompt, "max_new_tokens": n})["text"]


def generate(engine, prompt: str, **options):
    """``(pieces, finish)`` of one request to ``engine``, waited for."""
    out: queue.Queue = queue.Queue()
    engine.submit(TextRequest(engine.prompt_ids(prompt), out.put, **{"max_tokens": 20, "temperature": 0.0, **options}))
    pieces = []
    while True:
        item = out.get(timeout=60)
        if isinstance(item, BaseException):
            raise item
        if isinstance(item, dict):
            return pieces, item
        pieces.append(item)


# --------------------------------------------------------------------------- in-process
def test_requests_are_checked_field_by_field_in_openais_shape():
    ok = _openai.parse("completions", {"model": "m", "prompt": "x"})
    assert ok["max_tokens"] == 16 and ok["temperature"] == 1.0 and ok["stop"] == () and not ok["stream"]
    chat = _openai.parse("chat/completions", {"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert chat["max_tokens"] is None and chat["messages"] == [{"role": "user", "content": "x"}]
    bad = [
        ("completions", {"model": "m", "prompt": "x", "n": 2}, "n"),
        ("completions", {"model": "m", "prompt": "x", "logprobs": 2}, "logprobs"),
        ("completions", {"model": "m", "prompt": "x", "max_tokens": 0}, "max_tokens"),
        ("completions", {"model": "m", "prompt": [1, 2]}, "prompt"),
        ("completions", {"model": "m", "prompt": "x", "stop": ["a"] * 5}, "stop"),
        ("completions", {"model": "m", "prompt": "x", "temperature": 3}, "temperature"),
        ("completions", {"model": "m", "prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
        ("completions", {"prompt": "x"}, "model"),
        ("chat/completions", {"model": "m", "messages": [{"role": "user"}]}, "messages[0]"),
        ("chat/completions", {"model": "m", "messages": [], "max_completion_tokens": -1}, "messages"),
    ]
    for endpoint, body, param in bad:
        with pytest.raises(_openai.OpenAIError) as caught:
            _openai.parse(endpoint, body)
        assert caught.value.status == 400 and caught.value.param == param, (body, caught.value.message)
        error = json.loads(caught.value.response().body)["error"]
        assert set(error) == {"message", "type", "param", "code"} and error["type"] == "invalid_request_error"


def test_keys_are_kept_as_digests_from_a_list_a_variable_or_a_file(tmp_path, monkeypatch):
    settings = rm.ServeSettings(api="openai", api_keys=[KEY])
    assert KEY not in repr(settings) and settings.api_keys == (_auth.digest(KEY),)
    assert rm.ServeSettings.coerce({"api_keys": settings.api_keys}).api_keys == settings.api_keys  # idempotent
    monkeypatch.setenv("RAYMODEL_TEST_KEYS", f"{KEY}, other")
    assert rm.ServeSettings(api_keys="RAYMODEL_TEST_KEYS").api_keys == (_auth.digest(KEY), _auth.digest("other"))
    (tmp_path / "keys").write_text(f"# the route's keys\n{KEY}\n")
    assert rm.ServeSettings(api_keys=str(tmp_path / "keys")).api_keys == (_auth.digest(KEY),)
    with pytest.raises(SettingsError, match="neither"):
        rm.ServeSettings(api_keys="NO_SUCH_VARIABLE_OR_FILE")
    with pytest.raises(SettingsError, match="`api` must be one of"):
        rm.ServeSettings(api="vllm")
    keys = settings.api_keys
    assert _auth.allowed(keys, {"authorization": f"Bearer {KEY}"})
    assert not _auth.allowed(keys, {"authorization": "Bearer sk-wrong"}) and not _auth.allowed(keys, {})
    assert _auth.allowed(None, {})


def test_a_model_that_does_not_generate_text_is_refused_before_anything_starts(no_ray, registry):
    from hf_models import Sentiment
    from models import TinyNet

    from raymodel.exceptions import ServeError

    with pytest.raises(ServeError, match="does not generate text.*causal language model"):
        rm.Servable(Sentiment(), "/v1", settings={"api": "openai"})
    net = TinyNet()
    net.ensure_setup()
    rm.registry.put(net, key="tiny")
    for ref in ("tiny@*", "tiny:1"):
        with pytest.raises(SettingsError, match="`tiny.*` is a torch model; OpenAI's API"):
            rm.Servable(ref, "/v1", settings={"api": "openai"})


def test_the_engine_batches_requests_that_arrive_together_and_mid_generation(chatty):
    """Requests decoded together (and joining a running batch) answer as each would alone."""
    chatty.ensure_setup()
    want = {p: greedy(chatty, p, 20) for p in PROMPTS}
    chatty.model.train()  # as a model built in `setup` is: the engine answers in eval mode (no dropout) anyway
    sizes: list[int] = []
    engine = chatty.backend.text.engine(chatty, 16, sizes.append)
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        late = [
            pool.submit(lambda p=p, i=i: (time.sleep(0.02 * i), generate(engine, p))[1]) for i, p in enumerate(PROMPTS)
        ]
        got = {p: f.result() for p, f in zip(PROMPTS, late)}
    for p in PROMPTS:
        pieces, finish = got[p]
        assert "".join(pieces) == want[p], (p, pieces)
        assert finish == {
            "finish_reason": "length",
            "prompt_tokens": len(engine.prompt_ids(p)),
            "completion_tokens": 20,
        }
    assert max(sizes) > 1 and engine.joins, sizes
    # a stop string ends the text before it; its start is never sent, then taken back
    full = "".join(generate(engine, "la fa", max_tokens=30)[0])
    stop = full[8:12]
    pieces, finish = generate(engine, "la fa", max_tokens=30, stop=(stop, "zzz"))
    assert "".join(pieces) == full[: full.index(stop)] and finish["finish_reason"] == "stop", (full, pieces)
    # sampling: the same seed, the same text; top_p near 0 is greedy
    assert generate(engine, "crème", temperature=0.9, seed=7) == generate(engine, "crème", temperature=0.9, seed=7)
    assert "".join(generate(engine, "crème", temperature=1.0, top_p=1e-6)[0]) == want["crème"]
    with pytest.raises(ValueError, match="context is 64 tokens"):
        engine.prompt_ids("crème brûlée " * 20)
    engine.close()


# --------------------------------------------------------------------------- on Ray Serve
@pytest.mark.integration
def test_the_openai_client_completes_chats_and_streams_the_same_text_batched_behind_a_key(ray_session, chatty):
    chatty.ensure_setup()
    settings = rm.ServeSettings(api="openai", api_keys=[KEY], max_batch_size=8, max_ongoing_requests=32)
    served = chatty.serve("/v1", settings=settings)
    try:
        client = openai.OpenAI(base_url=served.url, api_key=KEY, max_retries=0)
        assert [m.id for m in client.models.list()] == ["Chatty"]
        # completions: the greedy text of model.predict, with OpenAI's object, finish and usage
        answer = greedy(chatty, "crème", 40)
        assert "brûlée" in answer and "🙂" in answer, answer  # characters of two and four bytes
        done = client.completions.create(model="Chatty", prompt="crème", max_tokens=40, temperature=0)
        assert done.object == "text_completion" and done.choices[0].text == answer
        assert done.choices[0].finish_reason == "length" and done.usage.completion_tokens == 40
        assert done.usage.prompt_tokens == len(chatty.tokenizer("crème")["input_ids"])
        # streamed: the pieces join to exactly that text; the usage comes last
        chunks = list(
            client.completions.create(
                model="Chatty",
                prompt="crème",
                max_tokens=40,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        pieces = [c.choices[0].text for c in chunks if c.choices]
        assert "".join(pieces) == answer and len([p for p in pieces if p]) > 3, pieces
        assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 40
        # chat: the tokenizer's template, the assistant's turn; streamed the same
        messages = [{"role": "system", "content": "réponds"}, {"role": "user", "content": "dessert?"}]
        rendered = chatty.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        said = greedy(chatty, rendered, 24)
        chat = client.chat.completions.create(model="Chatty", messages=messages, max_tokens=24, temperature=0)
        assert chat.object == "chat.completion" and chat.choices[0].message.content == said
        assert chat.choices[0].message.role == "assistant"
        streamed = client.chat.completions.create(
            model="Chatty", messages=messages, max_tokens=24, temperature=0, stream=True
        )
        deltas = [c.choices[0].delta.content or "" for c in streamed]
        assert "".join(deltas) == said, deltas
        # 8 at once, from one replica, decoded in batches: each answer as it is alone
        want = {p: greedy(chatty, p, 30) for p in PROMPTS}
        ask = lambda p: client.completions.create(model="Chatty", prompt=p, max_tokens=30, temperature=0)  # noqa: E731
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            answers = dict(zip(PROMPTS, pool.map(ask, PROMPTS)))
        assert {p: a.choices[0].text for p, a in answers.items()} == want
        info = requests.get(served.url + "/info", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
        assert max(info.json()["batch_sizes_seen"]) > 1, info.json()
        # errors in OpenAI's shape, from the client's own classes; the replica serves on
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=served.url, api_key="sk-wrong", max_retries=0).models.list()
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.completions.create(model="Chatty", prompt="crème", max_tokens=0)
        with pytest.raises(openai.BadRequestError, match="`n` must be 1"):
            client.completions.create(model="Chatty", prompt="crème", n=2)
        with pytest.raises(openai.BadRequestError, match="best_of"):
            client.completions.create(model="Chatty", prompt="crème", best_of=2)
        with pytest.raises(openai.NotFoundError, match="serves Chatty"):
            client.completions.create(model="gpt-4o", prompt="crème")
        bare = requests.post(served.url + "/completions", json={"model": "Chatty", "prompt": "x"}, timeout=30)
        assert bare.status_code == 401 and bare.json()["error"]["code"] == "invalid_api_key", bare.text
        assert requests.get(served.url + "/health", timeout=30).status_code == 401
        assert KEY not in info.text and _auth.digest(KEY) not in info.text
        again = client.completions.create(model="Chatty", prompt="crème", max_tokens=40, temperature=0)
        assert again.choices[0].text == answer
    finally:
        served.shutdown()
    logs = glob.glob(
        os.path.join(ray_session._private.worker._global_node.get_logs_dir_path(), "**", "*"), recursive=True
    )
    leaked = [path for path in logs if os.path.isfile(path) and KEY.encode() in open(path, "rb").read()]
    assert not leaked, leaked


@pytest.mark.integration
def test_adapters_on_one_base_answer_by_model_the_least_recently_used_goes_and_a_rollout_promotes(
    ray_session, registry, base
):
    versions = [taught(Bard(config={"base": base}), lesson, steps=60) for lesson in LESSONS]
    versions.append(taught(Bard(config={"base": base}), LESSONS[0][:2], steps=10))
    for i, (bard, alias) in enumerate(zip(versions, ["production", "candidate", None])):
        assert rm.registry.put(bard, key="bard", alias=alias).version == i + 1
    question = PAIRS[0][0]
    texts = [greedy(bard, question, 16) for bard in versions]
    assert texts[0] != texts[1], texts  # the two lessons answer differently
    settings = rm.ServeSettings(api="openai", max_models_per_replica=2)
    served = rm.Servable("bard@*", "/v1-bard", settings=settings).deploy()
    try:
        client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)
        ids = {m.id for m in client.models.list()}
        assert {"bard:1", "bard:2", "bard:3", "bard@production", "bard@candidate"} <= ids, ids

        def ask(model: str) -> str:
            done = client.completions.create(model=model, prompt=question, max_tokens=16, temperature=0)
            return done.choices[0].text

        with ThreadPoolExecutor(4) as pool:  # two adapters in one batch
            both = list(pool.map(ask, ["bard:1", "bard:2", "bard@production", "bard@candidate"]))
        assert both == [texts[0], texts[1], texts[0], texts[1]], both
        named = client.completions.create(model="bard@candidate", prompt=question, max_tokens=2, temperature=0)
        assert named.model == "bard:2"  # the version that answered
        assert ask("bard:3") == texts[2]
        info = requests.get(served.url + "/info", timeout=30).json()
        assert info["loaded"] == ["bard:2", "bard:3"] and info["evictions"] == 1, info  # bard:1 went
        assert ask("bard@production") == texts[0]  # back, as an adapter beside the held base
        info = requests.get(served.url + "/info", timeout=30).json()
        assert info["loaded"] == ["bard:3", "bard:1"] and info["bases_loaded"] == 1, info
        assert info["adapters_loaded"] == 4 and info["evictions"] == 2, info
        with pytest.raises(openai.NotFoundError, match="bard:1"):
            ask("bard:9")
    finally:
        served.shutdown()
    # The same route as Ray Serve's config file, deployed by Ray's `serve deploy`, behind a key: it answers
    # each version as the route above did.
    config_route(settings, question, texts)
    # a route of the production adapter, rolled out to the candidate under a guard
    served = rm.Servable("bard@production", "/v1-bard", settings={"api": "openai"}).deploy()
    stop = threading.Event()
    answered: list[str] = []
    client = openai.OpenAI(base_url=served.url, api_key="unused", max_retries=0)

    failed: list[Exception] = []

    def load() -> None:
        try:
            while not stop.is_set():
                done = client.completions.create(model="bard@production", prompt=question, max_tokens=16, temperature=0)
                answered.append(done.choices[0].text)
        except Exception as exc:  # noqa: BLE001 - said by the test's assertions
            failed.append(exc)

    try:
        assert [m.id for m in client.models.list()] == ["bard@production", "bard:1"]  # as written, then the version
        worker = threading.Thread(target=load)
        worker.start()
        rollout = None
        try:
            rollout = served.rollout(
                "bard@candidate", steps=(0.5, 1.0), step_s=1, guard=rm.Guard(max_error_rate=0.0, min_requests=3)
            )
            assert rollout.wait(timeout=120) == "promoted", (rollout.reason, failed)
        finally:
            stop.set()
            worker.join()
            if rollout is not None and rollout.status == "running":  # a failed wait sets the route back
                rollout.stop()
        assert not failed, failed
        assert set(answered) == {texts[0], texts[1]}, set(answered)  # both versions answered, nothing else
        assert rm.registry.show("bard", "production").version == 2
        after = client.completions.create(model="bard@production", prompt=question, max_tokens=16, temperature=0)
        assert after.choices[0].text == texts[1]
    finally:
        served.shutdown()


def config_route(settings: rm.ServeSettings, question: str, texts: list[str]) -> None:
    """``bard@*`` with ``settings`` and a key, written by ``rm.serve.config`` and deployed by ``serve deploy``."""
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    import ray
    from ray import serve

    proxy = rm.ServeSettings()  # the session's Serve, running already: its HTTP options
    given = {"api": "openai", "max_models_per_replica": settings.max_models_per_replica, "api_keys": [KEY]}
    path = Path(tempfile.mkdtemp()) / "bard.yaml"
    document = rm.serve.config(
        "bard@*", "/v1-bard-config", settings={**given, "host": proxy.host, "port": proxy.port}, path=path
    )
    assert KEY not in path.read_text()
    dashboard = "http://" + ray._private.worker.global_worker.node.address_info["webui_url"]
    command = [str(Path(sys.executable).parent / "serve"), "deploy", str(path), "--address", dashboard]
    out = subprocess.run(command, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    url = f"http://{proxy.host}:{proxy.port}/v1-bard-config"
    try:
        client = openai.OpenAI(base_url=url, api_key=KEY, max_retries=0)

        def listed() -> set[str] | None:
            try:
                return {m.id for m in client.models.list()}
            except openai.APIError:
                return None

        deadline = time.monotonic() + 180
        while not listed() and time.monotonic() < deadline:
            time.sleep(1.0)
        assert {"bard:1", "bard:2", "bard@production", "bard@candidate"} <= (listed() or set())
        for model, text in (("bard:1", texts[0]), ("bard@candidate", texts[1]), ("bard:3", texts[2])):
            done = client.completions.create(model=model, prompt=question, max_tokens=16, temperature=0)
            assert done.choices[0].text == text, model
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=url, api_key="sk-wrong", max_retries=0).models.list()
    finally:
        serve.delete(document["applications"][0]["name"])


def test_a_multiplexed_routes_router_asks_for_the_key_before_anything_else(tmp_path):
    """The keys guard the router of a raymodel-API route of a key's versions too (its own ingress)."""
    import asyncio
    from types import SimpleNamespace

    from raymodel.serve._routes.plan import RoutePlan
    from raymodel.serve._routes.versions import ModelRouter

    plan = RoutePlan(str(tmp_path / "registry"), multiplex="digits")
    router = ModelRouter(None, plan, {}, 1 << 20, rm.ServeSettings(api_keys=[KEY]).api_keys)
    request = SimpleNamespace(headers={}, method="GET", scope={"path": "/digits/info", "root_path": "/digits"})
    refused = asyncio.run(router(request))
    assert refused.status_code == 401 and json.loads(refused.body)["error"] == "unauthorized"
    request.headers = {"authorization": f"Bearer {KEY}"}
    health = SimpleNamespace(
        headers=request.headers, method="GET", scope={"path": "/digits/health", "root_path": "/digits"}
    )
    assert asyncio.run(router(health)).status_code == 200
