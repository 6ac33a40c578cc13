"""An OpenAI-compatible raymodel route vs a plain `generate` loop vs a hand-written Serve deployment.

One tiny GPT-2 built from a config (4 layers, 128 wide, 256 positions) over a byte-level BPE tokenizer
trained in code, taught the example's lines for 80 steps in process so that it writes words (nothing is
downloaded). Every side generates greedily, up to
`--max-tokens` tokens a request, on one CPU (`torch.set_num_threads(1)` in process; `num_cpus=1` replicas):
1. the plain loop: `model.generate` over the prompts one after another, in this process (no HTTP);
2. raymodel: `model.serve("/v1", settings=rm.ServeSettings(api="openai"))`, `POST /v1/completions` with
   `stream: true`, 1 client, then 8 concurrent clients (closed loop: each sends its next request when
   its last is answered);
3. hand-written: a Serve deployment whose `__call__` runs `model.generate` for its request on a thread
   (`max_ongoing_requests=8`: the same concurrency), 1 and 8 clients.
Prints generated tokens/s and time to first token p50/p99 (raymodel: the first streamed piece; the
hand-written deployment answers whole, so its first token comes with its last), and the goals' ratios:
1 client >= 0.8x the plain loop; 8 clients >= 3x raymodel's 1 client and >= 2x the hand-written 8.

    python benchmarks/llm_serving.py [--seconds 15] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from statistics import median

import requests

EXAMPLES = str(Path(__file__).resolve().parent.parent / "examples")
sys.path.insert(0, EXAMPLES)
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))  # Serve's replicas

from llm_lora import LINES, make_tokenizer  # noqa: E402 - after the path is set

import raymodel as rm  # noqa: E402

PROMPTS = [line[:24] for line in LINES] * 4


class TinyGPT(rm.RayTransformersModel):
    """A 4-layer GPT-2 from a config, seeded random weights."""

    default_config = {"seed": 0}

    def setup(self, config):
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel

        self.tokenizer = make_tokenizer()
        self.tokenizer.pad_token = self.tokenizer.eos_token
        torch.manual_seed(config["seed"])
        eos = self.tokenizer.eos_token_id
        self.model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(self.tokenizer),
                n_positions=256,
                n_embd=128,
                n_layer=4,
                n_head=4,
                bos_token_id=eos,
                eos_token_id=eos,
                pad_token_id=eos,
            )
        )


class HandWritten:
    """What a user writes by hand: each request's `generate` on a thread of the replica."""

    def __init__(self, folder: str) -> None:
        import torch
        from transformers import GPT2LMHeadModel, PreTrainedTokenizerFast

        torch.set_num_threads(1)
        self.tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
        self.model = GPT2LMHeadModel.from_pretrained(folder).eval()

    def _generate(self, prompt: str, max_tokens: int) -> dict:
        import torch

        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        eos = self.tokenizer.eos_token_id
        with torch.inference_mode():
            out = self.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=eos
            )
        new = out[0, ids.shape[-1] :]
        return {"text": self.tokenizer.decode(new, skip_special_tokens=True), "tokens": int(new.shape[-1])}

    async def __call__(self, request) -> dict:
        body = await request.json()
        return await asyncio.get_running_loop().run_in_executor(
            None, self._generate, body["prompt"], body["max_tokens"]
        )


def taught(model: TinyGPT, steps: int = 80) -> None:
    import torch

    batch = model.tokenizer(LINES, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(model.model.parameters(), lr=3e-3)
    model.model.train()
    for _ in range(steps):
        model.model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.model.eval()


def plain_loop(model: TinyGPT, seconds: float, max_tokens: int) -> dict:
    import torch

    torch.set_num_threads(1)
    tokens, began, i = 0, time.perf_counter(), 0
    eos = model.tokenizer.eos_token_id
    while time.perf_counter() - began < seconds:
        ids = model.tokenizer(PROMPTS[i % len(PROMPTS)], return_tensors="pt")["input_ids"]
        with torch.inference_mode():
            out = model.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, pad_token_id=eos
            )
        tokens += out.shape[-1] - ids.shape[-1]
        i += 1
    return {"tokens_s": tokens / (time.perf_counter() - began), "requests": i}


def raymodel_request(session: requests.Session, url: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    """``(generated tokens, seconds to the first piece)`` of one streamed completion."""
    body = {
        "model": "TinyGPT",
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    began, first, tokens = time.perf_counter(), None, 0
    with session.post(url + "/completions", json=body, stream=True, timeout=120) as answer:
        answer.raise_for_status()
        for line in answer.iter_lines():
            if not line.startswith(b"data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and chunk["choices"] and chunk["choices"][0]["text"]:
                first = time.perf_counter() - began
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return tokens, first if first is not None else time.perf_counter() - began


def hand_request(session: requests.Session, url: str, prompt: str, max_tokens: int) -> tuple[int, float]:
    began = time.perf_counter()
    answer = session.post(url, json={"prompt": prompt, "max_tokens": max_tokens}, timeout=120)
    answer.raise_for_status()
    return answer.json()["tokens"], time.perf_counter() - began


def load(call, url: str, clients: int, seconds: float, max_tokens: int) -> dict:
    """``clients`` closed loops for ``seconds``: generated tokens/s and time to first token p50/p99."""
    firsts: list[float] = []
    totals = [0] * clients
    deadline = time.perf_counter() + seconds

    def client(c: int) -> None:
        session, i = requests.Session(), c
        while time.perf_counter() < deadline:
            tokens, first = call(session, url, PROMPTS[i % len(PROMPTS)], max_tokens)
            totals[c] += tokens
            firsts.append(first)
            i += clients

    began = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    firsts.sort()
    return {
        "tokens_s": sum(totals) / (time.perf_counter() - began),
        "requests": len(firsts),
        "ttft_p50_ms": 1000 * median(firsts),
        "ttft_p99_ms": 1000 * firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=15.0, help="each side's closed loop")
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    from ray import serve

    model = TinyGPT()
    model.ensure_setup()
    taught(model)
    figures = {"plain loop (in process, no HTTP)": plain_loop(model, args.seconds, args.max_tokens)}
    rm.init()
    settings = rm.ServeSettings(
        api="openai", max_batch_size=16, max_ongoing_requests=64, ray_actor_options={"num_cpus": 1}
    )
    served = model.serve("/v1", settings=settings)
    load(raymodel_request, served.url, 1, 2, args.max_tokens)  # warm
    for clients in (1, 8):
        figures[f"raymodel, {clients} client(s)"] = load(
            raymodel_request, served.url, clients, args.seconds, args.max_tokens
        )
    info = requests.get(served.url + "/info", timeout=30).json()
    served.shutdown()
    folder = Path(tempfile.mkdtemp(prefix="llm-serving-")) / "tiny-gpt"
    model.save_pretrained(folder)
    app = serve.deployment(max_ongoing_requests=8, ray_actor_options={"num_cpus": 1})(HandWritten).bind(str(folder))
    serve.run(app, name="handwritten", route_prefix="/hand")
    url = "http://127.0.0.1:8000/hand"
    load(hand_request, url, 1, 2, args.max_tokens)  # warm
    for clients in (1, 8):
        figures[f"hand-written Serve, {clients} client(s)"] = load(
            hand_request, url, clients, args.seconds, args.max_tokens
        )
    serve.delete("handwritten")

    print(f"\n{'side':38} {'tokens/s':>9} {'requests':>9} {'TTFT p50 ms':>12} {'TTFT p99 ms':>12}")
    for side, f in figures.items():
        ttft = f"{f['ttft_p50_ms']:12.0f} {f['ttft_p99_ms']:12.0f}" if "ttft_p50_ms" in f else f"{'-':>12} {'-':>12}"
        print(f"{side:38} {f['tokens_s']:9.0f} {f['requests']:9d} {ttft}")
    print(f"raymodel's batch sizes seen: {info['batch_sizes_seen']} (mean {info['mean_batch_size']})")
    one, eight = figures["raymodel, 1 client(s)"]["tokens_s"], figures["raymodel, 8 client(s)"]["tokens_s"]
    plain = figures["plain loop (in process, no HTTP)"]["tokens_s"]
    hand = figures["hand-written Serve, 8 client(s)"]["tokens_s"]
    print(f"1 client vs the plain loop: {one / plain:.2f}x (goal >= 0.8x)")
    print(f"8 clients vs raymodel's 1 client: {eight / one:.2f}x (goal >= 3x)")
    print(f"8 clients vs the hand-written deployment's 8: {eight / hand:.2f}x (goal >= 2x)")


if __name__ == "__main__":
    main()
