"""Trainings that more than one test module checks, run once a session.

A run's checks live where their subject does (the conformance suite's in `conformance.py`, a
framework's own in its module), but the training under them is the same: the conformance suite keeps
a case's run here (``conformance:<backend>``, for a case marked ``shared``), and a module that checks
the same training reads it.
Selected alone, a module trains it itself.
"""

from __future__ import annotations

from typing import Any, Callable

#: name -> (model, result, data) of a run that ended well.
RUNS: dict[str, tuple[Any, Any, Any]] = {}


def once(name: str, train: Callable[[], tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """The run kept under ``name``, or ``train()``'s, kept."""
    if name not in RUNS:
        RUNS[name] = train()
    return RUNS[name]


def sentiment(**settings: Any) -> tuple[Any, Any, Any]:
    """The tiny BERT classifier of examples/transformers_sentiment.py on its generated sentiment set, on
    two workers, three epochs, 16 rows a batch: `(model, result, data)`."""
    from hf_models import Sentiment, sentiment_data

    data = sentiment_data()
    model = Sentiment()
    result = model.train({"num_workers": 2, "num_epochs": 3, "batch_size": 16, **settings}, data=data)
    return model, result, data
