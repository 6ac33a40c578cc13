"""Hugging Face transformers: ``RayTransformersModel`` on ``TorchTrainer`` + Hugging Face's ``Trainer``.

Each Ray Train worker runs ``Trainer.train`` (through Ray's ``prepare_trainer``); an epoch is a
``Trainer`` epoch. The ``TrainingArguments`` come from the settings (epochs, batch size, seed,
precision, accumulation, clipping, ``lr`` and ``weight_decay`` from the config; an evaluation, a log
and a checkpoint of the ``Trainer``'s own each epoch), and ``training_args(args)`` adjusts the rest.
A callback of raymodel's drives the run's lifecycle from the ``Trainer``'s callback points:
``on_epoch_begin`` begins an epoch, ``on_epoch_end`` begins validation, ``on_evaluate`` carries its
metrics, and ``on_save`` (after the ``Trainer`` wrote its checkpoint) ends the epoch, so the history
row, the stop vote and raymodel's checkpoint come after everything the ``Trainer`` does in an epoch.

Hooks: every hook of ``raymodel.hooks`` but ``before_batch`` (the ``Trainer`` feeds its own batches:
change them in a data collator); ``after_batch`` is called once per optimizer step with no outputs.
A row holds ``loss`` (the epoch's mean training loss over every worker) and the ``Trainer``'s
``eval_*`` metrics as ``val_*`` (raymodel's name for every backend: ``eval_loss`` is ``val_loss``).

A checkpoint holds the ``Trainer``'s own checkpoint folder: ``save_pretrained``'s model and tokenizer,
the optimizer, the LR scheduler and the trainer state; a run resumes with
``Trainer.train(resume_from_checkpoint=...)``. A class that declares ``lora = LoRA(...)`` trains a LoRA
adapter beside its frozen base (``_lora.py``), and its checkpoints hold the adapter, not the base.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping, Sequence

from raymodel._internal import tmp
from raymodel.backends.torch.backend import TorchBackend, TorchInference
from raymodel.backends.transformers._lora import LoRA
from raymodel.contract import Model, PoolKind, TextGeneration, WarmUp
from raymodel.contract.checkpoint import STATE_DIR
from raymodel.exceptions import CheckpointError, ModelDefinitionError
from raymodel.model import RayModel

if TYPE_CHECKING:
    import os

#: The folder inside a checkpoint's state folder: a plain transformers folder plus the ``Trainer``'s state.
HF_FOLDER = "hf"


class TransformersText(TextGeneration[Model]):
    """A causal LM's text generation: its engine (``_engine.py``), ``{"prompt": ...}`` requests, LoRA adapters."""

    def generates(self, model: Model) -> bool:
        from raymodel.backends.transformers._data import task_of

        return task_of(model.model) == "causal_lm"  # type: ignore[attr-defined]

    def engine(self, model: Model, max_batch_size: int, on_step: Any = None) -> Any:
        from raymodel.backends.transformers._engine import Engine

        return Engine(model, max_batch_size, on_step)

    def own_request(self, model: Model, payload: Any) -> Any:
        """A causal LM's ``{"prompt": ...}`` through the replica's engine (batched with the requests
        that arrive with it), unless the class answers requests its own way (``preprocess``, ``forward``
        or ``postprocess`` of its own)."""
        kind = type(model)
        if not self.generates(model) or any(
            getattr(kind, name) is not getattr(RayModel, name) for name in ("preprocess", "forward", "postprocess")
        ):
            return None
        from raymodel.backends.transformers import _text

        request = _text.generation(payload)
        o = request.options
        sampled = o["do_sample"]
        return request.prompts, {
            "max_tokens": o["max_new_tokens"],
            "temperature": o.get("temperature", 1.0) if sampled else 0.0,
            "top_k": o.get("top_k", getattr(model.model.generation_config, "top_k", None) or 0) if sampled else 0,  # type: ignore[attr-defined]
            "top_p": o.get("top_p", 1.0) if sampled else 1.0,
        }

    def attach_adapter(self, model: Model, directory: Any, name: str) -> None:
        from raymodel.backends.transformers import _lora

        _lora.attach(model, Path(directory) / STATE_DIR / HF_FOLDER, name)

    def detach_adapter(self, model: Model, name: str) -> None:
        model.model.delete_adapter(name)  # type: ignore[attr-defined]


class TransformersInference(TorchInference):
    """The torch backend's eval mode; text in and out (``_text.py``): a model's answers to prompts, a causal
    LM's streamed, and ``predict_batch``'s text column."""

    checks_first_layer = False  # token ids reach an embedding; a shape error inside is not the request's

    def preprocess(self, model: Model, payload: Any) -> Any:
        from raymodel.backends.transformers import _text

        return _text.preprocess(model, payload)

    def forward(self, model: Model, x: Any) -> Any:
        from raymodel.backends.transformers import _text

        return _text.forward(model, x)

    def postprocess(self, model: Model, output: Any) -> Any:
        from raymodel.backends.transformers import _text

        return _text.postprocess(model, output)

    def stack(self, inputs: Sequence[Any]) -> Any:
        from raymodel.backends.transformers import _text

        return _text.stack(inputs)

    def stream(self, model: Model, payload: Any) -> Iterator[str]:
        from raymodel.backends.transformers import _text

        return _text.stream(model, payload)

    def batch_input(self, model: Model, batch: Mapping[str, Any]) -> Any:
        """``predict_batch``: the text column of each Ray Data batch."""
        column = getattr(model, "text_column", "text")
        if column not in batch:
            raise ValueError(f"`predict_batch` of a transformers model needs a `{column}` column; got {sorted(batch)}.")
        return self.preprocess(model, {"text": [str(t) for t in batch[column]]})


class TransformersBackend(TorchBackend):
    """The torch backend's runs with HF's ``Trainer``, its isolation, checkpoints, text in and out."""

    name = "transformers"
    extra = "transformers"
    imports = ("torch", "transformers", "datasets", "accelerate")
    pool = PoolKind("torch", ("raymodel.backends.transformers._loop", "transformers.trainer", "torch._dynamo"))
    warm_up = WarmUp(runner_imports=("transformers.modeling_utils",))  # `PreTrainedModel`: 1-2 s of a first set-up
    packages = ("torch", "transformers", "tokenizers", "datasets", "accelerate")
    accepts = ("torch_dataset",)
    required_methods = ("setup",)
    hook_notes = {
        "before_batch": "no (the Trainer feeds its own batches; change them in a data collator)",
        "after_batch": "yes (once per optimizer step, outputs None)",
    }
    state_keys = ("transformers", "modules")
    strategies = ("ddp",)
    elastic = False
    methods = ("grpo", "dpo")  # TRL's GRPOTrainer and DPOTrainer (_post.py)
    training = dataclasses.replace(TorchBackend.training, loop="raymodel.backends.transformers._loop:TrainerLoop")
    inference = TransformersInference()
    text = TransformersText()

    def after_user_setup(self, model: Model, returned: Any) -> None:
        import transformers

        from raymodel.backends.transformers import _lora

        spec = _lora.declared(model)
        hf = getattr(model, "model", None)
        if not isinstance(hf, transformers.PreTrainedModel):
            got = "nothing" if hf is None else f"a {type(hf).__name__}"
            adapted = " (the base that `lora` adapts)" if spec is not None else ""
            raise ModelDefinitionError(
                f"`{type(model).__name__}.setup` must assign `self.model`, a transformers `PreTrainedModel`{adapted} "
                f"(e.g. `self.model = BertForSequenceClassification(BertConfig(...))`); it assigned {got}."
            )
        if spec is not None:
            _lora.wrap(model, spec)

    def prepare_data(self, model: Model, data: Any) -> Any:
        from raymodel.data import DataSpec

        if data is None or isinstance(data, DataSpec):
            return data
        from raymodel.backends.transformers._data import prepare

        return prepare(model, data)

    def prepare_method_data(self, model: Model, data: Any, method: Any) -> Any:
        from raymodel.data import DataSpec

        if isinstance(data, DataSpec):  # prepared already (a job's runner is handed the driver's)
            return data
        from raymodel.backends.transformers import _post

        return _post.prepare(model, data, method)

    def input_signature(self, model: Model, spec: Any) -> dict[str, Any] | None:
        return None  # text in: what a request must hold is checked by `preprocess`

    # ---------------------------------------------------------------- state
    def get_state(self, model: Model) -> dict[str, Any]:
        """The model and tokenizer as ``save_pretrained`` writes them (outside a run: ``model.save``)."""
        staging = tmp.make("hf-state")
        _save_pretrained(model, staging)
        return {"transformers": str(staging)}

    def write_state(self, model: Model, state: dict[str, Any], directory: Path) -> None:
        if "transformers" not in state:
            return super().write_state(model, state, directory)
        shutil.move(state["transformers"], directory / HF_FOLDER)

    def read_state(self, model: Model, directory: Path) -> dict[str, Any]:
        source = directory / HF_FOLDER
        if not source.is_dir():
            return super().read_state(model, directory)
        copy = tmp.make("hf-state")  # outlives the checkpoint's local copy (a run resumes from it)
        shutil.copytree(source, copy, dirs_exist_ok=True)
        return {"transformers": str(copy), "transformers_copy": True}

    def set_state(self, model: Any, state: dict[str, Any]) -> None:
        """The weights of the state's folder; ``read_state``'s copy of it is removed after (a training
        run's loop keeps it: the ``Trainer`` resumes from it)."""
        folder = state.get("transformers")
        if folder is None:
            return super().set_state(model, state)
        from raymodel.backends.transformers import _lora
        from raymodel.backends.transformers._data import quiet

        try:
            if _lora.is_adapted(model.model):
                _lora.load_adapter(model, Path(folder))
                return
            if (Path(folder) / _lora.ADAPTER_CONFIG).is_file():
                raise CheckpointError(
                    f"`{folder}` holds a LoRA adapter, but `{type(model).__name__}` declares no `lora`: load it "
                    "with the class that trained it."
                )
            with quiet():
                loaded = type(model.model).from_pretrained(folder)
            model.model.load_state_dict(loaded.state_dict())
        finally:
            if state.get("transformers_copy"):
                shutil.rmtree(folder, ignore_errors=True)


class RayTransformersModel(RayModel):
    """A Hugging Face transformers model, trained with HF's ``Trainer`` on Ray Train workers.

    ``setup(config)`` assigns ``self.model`` (any ``PreTrainedModel``) and ``self.tokenizer``;
    ``tokenize(batch)`` turns a batch of the data's columns into the model's inputs (default: the
    tokenizer over ``batch["text"]``). The data: a ``datasets.Dataset`` or ``DatasetDict``, a
    ``ray.data`` Dataset, a pandas DataFrame or a dict of lists (or ``{"train": ..., "valid": ...}``
    of them); a classifier's labels are the ``label`` column. ``predict`` and serving take text:
    ``{"text": [...]}`` -> ``{"label": [...], "score": [...]}`` for a sequence classifier,
    ``{"prompt": "...", "max_new_tokens": 8}`` -> ``{"text": "..."}`` for a causal LM
    (``{"stream": true}`` streams it as server-sent events), the raw outputs for other heads.

    A causal LM also trains on ``prompt``/``completion`` columns and chat ``messages`` columns, the
    loss counting the answers' tokens only; ``lora = rm.LoRA(r=8)`` on the class trains a LoRA adapter
    beside the frozen base (``pip install 'raymodel[llm]'``).

    Example:
        >>> class Sentiment(rm.RayTransformersModel):
        ...     def setup(self, config):
        ...         self.tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="[PAD]")
        ...         self.model = BertForSequenceClassification(BertConfig(vocab_size=100, num_labels=2))
        ...     def tokenize(self, batch):
        ...         return self.tokenizer(batch["text"], padding="max_length", max_length=16, truncation=True)
    """

    backend = TransformersBackend()
    #: The transformers ``PreTrainedModel`` that ``setup`` assigns.
    model: Any = None
    #: Its tokenizer (or processor), which ``setup`` assigns; saved with the model.
    tokenizer: Any = None
    #: The column the default ``tokenize`` (and ``predict_batch``) reads.
    text_column: str = "text"
    #: The default ``tokenize``'s truncation length of a ``text`` column (the config's ``max_length`` wins).
    max_length: int = 128
    #: A LoRA adapter to train beside the frozen base (``rm.LoRA(r=8)``); ``None``: every weight trains.
    lora: LoRA | None = None

    def tokenize(self, batch: dict[str, list[Any]]) -> Mapping[str, Any]:
        """A batch of the data's columns (``{"text": [...], "label": [...]}``) -> the model's inputs
        (``input_ids``, ``attention_mask``, ...). Applied once per dataset, on the driver.

        Default: the tokenizer over the ``text`` column (truncated to the ``max_length`` config key, else
        the class's ``max_length``); or ``prompt``/``completion`` or chat ``messages`` columns with
        ``labels`` that count the answers' tokens only (truncated to the ``max_length`` config key, else
        the model's positions)."""
        if self.tokenizer is None:
            raise ModelDefinitionError(
                f"`{type(self).__name__}` has no `self.tokenizer`: assign one in `setup`, or define `tokenize(batch)`."
            )
        if self.text_column not in batch:
            from raymodel.backends.transformers import _chat

            return _chat.tokenize(self, batch)
        most = self.config.get("max_length") or self.max_length
        return self.tokenizer(batch[self.text_column], truncation=True, max_length=int(most))

    def training_args(self, args: Any) -> Any:
        """Adjust the ``TrainingArguments`` raymodel built (a scheduler, warm-up, weight decay, ...) and
        return them. The epochs, evaluation, logging, saving and ``output_dir`` stay raymodel's."""
        return args

    def data_collator(self) -> Any:
        """The ``Trainer``'s data collator; ``None``: padding for a classifier, language modelling
        labels (``DataCollatorForLanguageModeling(mlm=False)``) for a causal LM."""
        return None

    def compute_metrics(self, predictions: Any, labels: Any) -> dict[str, float]:
        """Metrics of an evaluation from the gathered predictions and labels (numpy). Default:
        ``accuracy`` for a sequence classifier, nothing else (a causal LM's ``val_loss`` is reported)."""
        import numpy as np

        logits = predictions[0] if isinstance(predictions, tuple) else predictions
        return {"accuracy": float((np.asarray(logits).argmax(-1) == np.asarray(labels)).mean())}

    def save_pretrained(self, path: str | os.PathLike[str], merged: bool = False) -> str:
        """Write a plain transformers folder (model and tokenizer) that ``AutoModel...from_pretrained``
        and ``AutoTokenizer.from_pretrained`` load without raymodel; returns its path.

        With ``lora``: peft's adapter folder (``adapter_config.json``, ``adapter_model.safetensors``) that
        ``PeftModel.from_pretrained(base, path)`` loads; ``merged=True``: the adapter merged into the
        base, a plain transformers model."""
        self.ensure_setup()
        target = Path(path)
        with tmp.replacing(target.resolve(), ".raymodel-pretrained") as staging:  # whole or not at all
            _save_pretrained(self, staging, merged=merged)
        return str(target)

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike[str], config: Mapping[str, Any] | None = None) -> Any:
        """An instance whose ``self.model`` (and ``self.tokenizer``, where the folder has one) are
        loaded from a transformers folder (``save_pretrained``'s, or any local one)."""
        from raymodel.exceptions import CheckpointError

        folder = Path(path)
        if not (folder / "config.json").is_file() and not (folder / "adapter_config.json").is_file():
            raise CheckpointError(
                f"`{path}` is not a transformers folder (it has no config.json); pass a folder that "
                "`save_pretrained` wrote."
            )
        model = cls(config=config)
        model.ensure_setup()
        from raymodel.backends.transformers import _lora
        from raymodel.backends.transformers._data import quiet

        if _lora.is_adapted(model.model) or (folder / _lora.ADAPTER_CONFIG).is_file():
            model.backend.set_state(model, {"transformers": str(folder)})  # the adapter onto setup's base
        else:
            with quiet():
                model.model = type(model.model).from_pretrained(folder)
        if (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            model.tokenizer = AutoTokenizer.from_pretrained(folder)
        model.source = {"pretrained": str(folder)}
        return model

    @property
    def adapter_of(self) -> dict[str, Any] | None:
        """With ``lora``, once set up: the base the adapter fits, as its checkpoints and registry versions
        name it: ``{"fingerprint": sha256 of the base's weights, "base": config["base"]}``."""
        from raymodel.backends.transformers import _lora

        if not _lora.is_adapted(self.model):
            return None
        return {"fingerprint": _lora.base_fingerprint(self.model), "base": self.config.get("base")}

    def stream(self, payload: Mapping[str, Any]) -> Iterator[str]:
        """A causal LM's generation for ``{"prompt": "...", "max_new_tokens": n}``, one token at a time."""
        self.ensure_setup()
        return self.backend.inference.stream(self, payload)


def _save_pretrained(model: Any, folder: Path, merged: bool = False) -> None:
    from raymodel.backends.transformers import _lora
    from raymodel.backends.transformers._data import quiet

    with quiet():
        if not _lora.is_adapted(model.model):
            model.model.save_pretrained(folder)
        elif merged:
            _lora.merged(model.model).save_pretrained(folder)
        else:
            _lora.save_adapter(model, folder)
    if model.tokenizer is not None and hasattr(model.tokenizer, "save_pretrained"):
        model.tokenizer.save_pretrained(folder)


__all__ = ["LoRA", "RayTransformersModel", "TransformersBackend"]
