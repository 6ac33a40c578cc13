"""Transformers models for the tests (an importable module: Ray's workers load them by name)."""

from __future__ import annotations

import sys
from pathlib import Path

import raymodel as rm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

import cloudpickle
import llm_grpo
from llm_grpo import bpe_tokenizer, gpt2, prompts_data, sums, sums_tokenizer
from transformers_sentiment import (
    VOCAB,
    Sentiment,
    Writer,
    make_tokenizer,
    sentiment_data,
    sentiment_rows,
    story_rows,
)

#: The example's builders travel with the classes that call them (a worker has no `examples/` on its path).
cloudpickle.register_pickle_by_value(llm_grpo)

__all__ = [
    "CHAT_TEMPLATE",
    "PAIRS",
    "POEMS",
    "Bard",
    "Chatty",
    "VOCAB",
    "Poet",
    "Sentiment",
    "Writer",
    "make_bpe_tokenizer",
    "make_tokenizer",
    "pair_rows",
    "save_poet_base",
    "chat_rows",
    "sentiment_data",
    "sentiment_rows",
    "story_rows",
    "taught",
]


#: Accented text and emoji for a byte-level BPE tokenizer: most of these characters are two to four
#: bytes, which a small vocabulary leaves split over several tokens.
POEMS = [
    "crème brûlée au café, très naïve 🙂",
    "la façade du château, über schön 🎉",
    "smörgåsbord à Zürich, piñata 🌮 jalapeño",
    "déjà vu, entrée et soufflé 🍰 voilà",
    "garçon, un crème! señor, ¿qué tal? 🙂🎉",
]


def make_bpe_tokenizer(vocab_size: int = 272):
    """A byte-level BPE tokenizer (GPT-2's kind) trained in code on ``POEMS``: nothing is downloaded."""
    return bpe_tokenizer(POEMS * 4, vocab_size, max_length=64)


class Poet(rm.RayTransformersModel):
    """A two-layer GPT-2 over a byte-level BPE vocabulary, its weights seeded (``config["seed"]``)."""

    default_config = {"lr": 3e-3, "seed": 3}

    def setup(self, config):
        self.tokenizer = make_bpe_tokenizer()
        self.model = gpt2(self.tokenizer, seed=config["seed"], n_positions=64, n_embd=32, n_head=2)

    def tokenize(self, batch):
        return self.tokenizer(batch["text"], truncation=True, max_length=32)


#: A chat template (Jinja, as Hugging Face tokenizers carry it): short turns for a 64-position model.
CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] }}: {{ m['content'] }}<|endoftext|>{% endfor %}"
    "{% if add_generation_prompt %}a: {% endif %}"
)

#: Questions and answers in accented text and emoji: the answer's characters span several tokens.
PAIRS = [
    ("dessert?", " crème brûlée 🍰"),
    ("où?", " la façade du château 🎉"),
    ("quoi?", " smörgåsbord à Zürich 🌮"),
    ("encore?", " déjà vu, voilà 🙂"),
]


class Chatty(Poet):
    """``Poet`` with a chat template, its weights loaded from ``config["base"]`` (a folder
    ``save_pretrained`` wrote; a seeded random ``Poet`` without one); raymodel's own ``tokenize``
    (prompt/completion and chat columns)."""

    default_config = {"lr": 2e-2, "seed": 3, "base": None}
    tokenize = rm.RayTransformersModel.tokenize

    def setup(self, config):
        super().setup(config)
        self.tokenizer.chat_template = CHAT_TEMPLATE
        if config["base"]:
            from transformers import GPT2LMHeadModel

            self.model = GPT2LMHeadModel.from_pretrained(config["base"])


class Bard(Chatty):
    """``Chatty`` with a LoRA adapter (rank 4 on GPT-2's ``c_attn``)."""

    lora = rm.LoRA(r=4, target_modules=("c_attn",))


def save_poet_base(folder, seed: int = 3, steps: int = 150) -> str:
    """A base that has learned the poems (plain torch, in-process), saved with ``save_pretrained``: LoRA
    adapts a base that knows something (a random one's logits are too flat for a small adapter to move)."""
    import torch

    poet = Poet(config={"seed": seed})
    poet.ensure_setup()
    batch = poet.tokenizer(POEMS, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(poet.model.parameters(), lr=1e-2)
    poet.model.train()
    for _ in range(steps):
        poet.model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    poet.model.save_pretrained(folder)
    return str(folder)


def pair_rows(n: int = 64) -> dict[str, list[str]]:
    return {
        "prompt": [PAIRS[i % len(PAIRS)][0] for i in range(n)],
        "completion": [PAIRS[i % len(PAIRS)][1] for i in range(n)],
    }


def chat_rows(n: int = 64) -> dict[str, list]:
    return {
        "messages": [
            [
                {"role": "system", "content": "réponds"},
                {"role": "user", "content": PAIRS[i % len(PAIRS)][0]},
                {"role": "assistant", "content": PAIRS[i % len(PAIRS)][1].strip()},
            ]
            for i in range(n)
        ]
    }


def taught(model, pairs=PAIRS, steps: int = 60, lr: float = 3e-2):
    """``model`` (set up here) taught the answers of ``pairs`` (its trainable weights: a ``Bard``'s
    adapter, a ``Chatty``'s all), plain torch, in-process."""
    import torch
    from transformers import DataCollatorForSeq2Seq

    model.ensure_setup()
    rows = model.tokenize({"prompt": [p for p, _ in pairs], "completion": [c for _, c in pairs]})
    batch = DataCollatorForSeq2Seq(model.tokenizer, label_pad_token_id=-100)(
        [{k: rows[k][i] for k in rows} for i in range(len(pairs))]
    )
    optimizer = torch.optim.Adam([p for p in model.model.parameters() if p.requires_grad], lr=lr)
    model.model.train()
    for _ in range(steps):
        model.model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.model.eval()
    return model


def sum_prompts(n: int, start: int = 0) -> dict[str, list[str]]:
    """``prompt`` (``12+34→``) and ``answer`` columns of ``n`` sums."""
    return prompts_data(sums(n, start))


class Sevens(rm.RayTransformersModel):
    """A random two-layer GPT-2 over the sums' byte-level BPE, a LoRA adapter on it, rewarded for the share
    of sevens in its completions: a reward no supervised data teaches, which GRPO alone moves."""

    lora = rm.LoRA(r=8, alpha=16, target_modules=("c_attn", "c_fc"))
    default_config = {"lr": 2e-2, "seed": 0}

    def setup(self, config):
        self.tokenizer = sums_tokenizer()
        self.model = gpt2(self.tokenizer, seed=config["seed"], n_head=2)

    def reward(self, prompts, completions, answer, **columns):
        return [sum(ch == "7" for ch in c) / max(len(c), 1) for c in completions]
