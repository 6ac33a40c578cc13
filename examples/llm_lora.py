"""Fine-tune a causal LM with a LoRA adapter: one class, two Ray Train workers, a registry version.

A small GPT-2 is built from a config over a byte-level BPE tokenizer trained in code (nothing is
downloaded) and learns a few lines of accented text in full: that is the base, saved as a plain
transformers folder. An `Assistant` then declares `lora = rm.LoRA(r=8, ...)`, loads that base in
`setup`, and trains only its adapter on prompt/completion pairs (the loss counts the answers'
tokens). The adapter is registered (its bytes, and the fingerprint of the base it fits), fetched
back, saved as peft's folder and merged into a plain model, and answers a prompt; then the key's
versions are served with OpenAI's API and called with the `openai` client, streamed.

The base is saved in ``./llm_lora_base``: the registered adapter's config names that folder, so
``raymodel serve assistant@production --route /v1 --api openai`` serves it once this script has ended.

python examples/llm_lora.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import raymodel as rm

LINES = [
    "crème brûlée au café, très naïve 🙂",
    "la façade du château, über schön 🎉",
    "smörgåsbord à Zürich, piñata 🌮 jalapeño",
    "déjà vu, entrée et soufflé 🍰 voilà",
]
PAIRS = [("dessert?", " crème brûlée 🍰"), ("où?", " la façade du château 🎉"), ("quoi?", " smörgåsbord à Zürich 🌮")]


def make_tokenizer(texts=tuple(LINES * 4), vocab_size: int = 300):
    """A byte-level BPE tokenizer (GPT-2's kind) trained in code on ``texts`` (default: ``LINES``)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(list(texts), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", model_max_length=64)


class Base(rm.RayTransformersModel):
    """The base: a two-layer GPT-2 from a config, every weight trained on ``LINES``."""

    default_config = {"lr": 1e-2}

    def setup(self, config):
        from transformers import GPT2Config, GPT2LMHeadModel

        self.tokenizer = make_tokenizer()
        eos = self.tokenizer.eos_token_id
        self.model = GPT2LMHeadModel(  # its own token ids: GPT2Config's defaults are GPT-2's (50256)
            GPT2Config(
                vocab_size=len(self.tokenizer),
                n_positions=64,
                n_embd=64,
                n_layer=2,
                n_head=2,
                bos_token_id=eos,
                eos_token_id=eos,
            )
        )


class Assistant(rm.RayTransformersModel):
    """A LoRA adapter of rank 8 on the base's attention (``c_attn``) and its MLP's first layer (``c_fc``);
    the base stays frozen. (On ``c_attn`` alone, this tiny base learned every answer's words but not
    which answer each prompt asks for: its answers all began " me".)"""

    lora = rm.LoRA(r=8, target_modules=("c_attn", "c_fc"))
    default_config = {"lr": 3e-2, "base": None}

    def setup(self, config):
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(config["base"])
        self.model = AutoModelForCausalLM.from_pretrained(config["base"])


def main() -> None:
    two = {"num_workers": 2, "batch_size": 8}
    with tempfile.TemporaryDirectory() as scratch:
        base = Base()
        base.train({**two, "num_epochs": 30}, data={"text": LINES * 8})
        # The base stays where the registered adapter's `setup` finds it (its config names the folder):
        # `raymodel serve assistant@production --api openai` serves it after this script has ended.
        folder = base.save_pretrained(Path("llm_lora_base").resolve())
        print(f"the base: {folder}")

        assistant = Assistant(config={"base": folder})
        data = {"prompt": [p for p, _ in PAIRS] * 16, "completion": [c for _, c in PAIRS] * 16}
        result = assistant.train({**two, "num_epochs": 40}, data={"train": data, "valid": data})
        print("answers' loss by epoch:", [round(row["val_loss"], 3) for row in result.history])

        ref = rm.registry.put(assistant, key="assistant", alias="production")
        print(f"registered {ref}: the adapter's bytes, and the fingerprint of the base it fits")
        served = rm.registry.get("assistant@production")
        for prompt, _ in PAIRS:
            print(f"{prompt!r} -> {served.predict({'prompt': prompt, 'max_new_tokens': 24})['text']!r}")
        adapter = assistant.save_pretrained(Path(scratch) / "adapter")  # peft's folder: adapter_config.json, ...
        kib = [
            (Path(f) / name).stat().st_size / 1024
            for f, name in ((adapter, "adapter_model.safetensors"), (folder, "model.safetensors"))
        ]
        print(f"the adapter: {kib[0]:.1f} KiB, beside a base of {kib[1]:.1f} KiB")
        assistant.save_pretrained(Path(scratch) / "merged", merged=True)  # a plain transformers model

        # OpenAI's API over the key's versions: a request's `model` names one (its adapter beside the base,
        # which each replica loads once); `pip install openai` for the client.
        import openai

        app = rm.Servable("assistant@*", "/v1", settings=rm.ServeSettings(api="openai")).deploy()
        try:
            client = openai.OpenAI(base_url=app.url, api_key="unused")
            print("served models:", [m.id for m in client.models.list()])
            for prompt, _ in PAIRS:
                chunks = client.completions.create(
                    model="assistant@production", prompt=prompt, max_tokens=24, temperature=0, stream=True
                )
                text = "".join(c.choices[0].text for c in chunks if c.choices)
                print(f"{prompt!r} -> {text!r} (streamed over OpenAI's API)")
        finally:
            app.shutdown()


if __name__ == "__main__":
    main()
