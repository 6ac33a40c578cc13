"""Hugging Face transformers from one class: fine-tune a tiny BERT classifier and a tiny GPT-2 with HF's
`Trainer` on two Ray Train workers, then stream a generation over HTTP as server-sent events.

Both models are built from a config and the tokenizer is made in code (`tokenizers` WordLevel +
`PreTrainedTokenizerFast`): nothing is downloaded. The data is a generated sentiment set and a tiny
grammar's sentences.

python examples/transformers_sentiment.py
"""

from __future__ import annotations

import json
import random

import requests

import raymodel as rm

POSITIVE = ["good", "great", "happy", "fine", "bright", "lovely", "nice", "glad"]
NEGATIVE = ["bad", "awful", "sad", "poor", "dark", "ugly", "grim", "dull"]
NEUTRAL = ["the", "a", "day", "was", "film", "food", "is", "it", "very", "and", "this", "of", "we", "saw"]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[EOS]"]
VOCAB = SPECIAL + POSITIVE + NEGATIVE + NEUTRAL


def make_tokenizer():
    """A word-level tokenizer over ``VOCAB`` (``tokenizers`` WordLevel + ``PreTrainedTokenizerFast``)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(VOCAB)}, unk_token="[UNK]"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]", model_max_length=32
    )


def sentiment_rows(n: int, seed: int = 0) -> dict[str, list]:
    """``{"text": [...], "label": [...]}``: sentences of neutral words with two or three words of one
    sentiment (label 1 positive, 0 negative)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for _ in range(n):
        label = rng.randint(0, 1)
        words = [rng.choice(NEUTRAL) for _ in range(rng.randint(4, 8))]
        for _ in range(rng.randint(2, 3)):
            words.insert(rng.randint(0, len(words)), rng.choice(POSITIVE if label else NEGATIVE))
        texts.append(" ".join(words))
        labels.append(label)
    return {"text": texts, "label": labels}


def story_rows(n: int, seed: int = 0) -> dict[str, list]:
    """Sentences of a tiny grammar for a causal LM: ``the good day was bright [EOS]``."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        mood = POSITIVE if rng.random() < 0.5 else NEGATIVE
        texts.append(f"the {rng.choice(mood)} {rng.choice(['day', 'film', 'food'])} was {rng.choice(mood)} [EOS]")
    return {"text": texts}


def sentiment_data(n_train: int = 512, n_valid: int = 128):
    """A ``datasets.DatasetDict`` with ``train`` and ``validation``."""
    import datasets

    return datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict(sentiment_rows(n_train, seed=0)),
            "validation": datasets.Dataset.from_dict(sentiment_rows(n_valid, seed=1)),
        }
    )


def tiny_bert(hidden: int = 32):
    """A two-layer BERT classifier over ``VOCAB``, built from a config (random weights)."""
    from transformers import BertConfig, BertForSequenceClassification

    return BertForSequenceClassification(
        BertConfig(
            vocab_size=len(VOCAB),
            hidden_size=hidden,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=2 * hidden,
            max_position_embeddings=32,
            num_labels=2,
            pad_token_id=0,
        )
    )


class Sentiment(rm.RayTransformersModel):
    """A two-layer BERT classifier, 32 wide."""

    default_config = {"lr": 2e-3, "hidden": 32}

    def setup(self, config):
        self.tokenizer = make_tokenizer()
        self.model = tiny_bert(config["hidden"])

    def tokenize(self, batch):
        return self.tokenizer(batch["text"], padding="max_length", truncation=True, max_length=16)

    def hyperparameter_space(self):
        return {"lr": rm.tune.loguniform(5e-4, 5e-3)}


class Writer(rm.RayTransformersModel):
    """A two-layer GPT-2, 32 wide."""

    default_config = {"lr": 3e-3}

    def setup(self, config):
        from transformers import GPT2Config, GPT2LMHeadModel

        self.tokenizer = make_tokenizer()
        eos = VOCAB.index("[EOS]")
        self.model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(VOCAB),
                n_positions=32,
                n_embd=32,
                n_layer=2,
                n_head=2,
                bos_token_id=eos,
                eos_token_id=eos,
                pad_token_id=0,
            )
        )

    def tokenize(self, batch):
        return self.tokenizer(batch["text"], truncation=True, max_length=16)


if __name__ == "__main__":
    rm.init(num_cpus=2)
    settings = rm.TrainSettings(num_workers=2, num_epochs=3, batch_size=16)

    classifier = Sentiment()
    result = classifier.train(settings, data=sentiment_data())
    result.plot("demo-output/transformers_sentiment.png")
    print(f"validation accuracy {result.metrics['val_accuracy']:.3f} after {len(result.history)} epochs")
    print(classifier.predict({"text": ["a great film and a happy day", "the food was awful"]}))
    print("a plain transformers folder:", classifier.save_pretrained("demo-output/sentiment"))

    writer = Writer()
    writer.train(settings, data=story_rows(400))
    served = writer.serve("/writer")
    print("streaming 'the good' -> ", end="", flush=True)
    request = {"prompt": "the good", "max_new_tokens": 6, "stream": True}
    with requests.post(served.url, json=request, stream=True, timeout=60) as events:
        for line in events.iter_lines(decode_unicode=True):
            if line.startswith("data: {"):
                print(json.loads(line.removeprefix("data: "))["token"], end="", flush=True)  # pieces of text
    print()
    served.shutdown()
