"""Transformers models for the tests (an importable module: Ray's workers load them by name)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))

from transformers_sentiment import (
    VOCAB,
    Sentiment,
    Writer,
    make_tokenizer,
    sentiment_data,
    sentiment_rows,
    story_rows,
)

__all__ = ["VOCAB", "Sentiment", "Writer", "make_tokenizer", "sentiment_data", "sentiment_rows", "story_rows"]
