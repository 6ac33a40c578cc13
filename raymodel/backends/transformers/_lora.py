"""LoRA adapters on a ``RayTransformersModel``: ``lora = rm.LoRA(r=8)`` on the class, peft underneath.

``setup`` builds (or loads) the base as it would without adapters; after it, the base is wrapped
with peft's ``get_peft_model`` (``wrap``): its weights frozen, a low-rank adapter beside each
target module, GPT-2's ``Conv1D`` layers handled (``fan_in_fan_out``). The config keys ``lora_r``
and ``lora_alpha`` override the class's rank and alpha, so ``model.tune`` can search them.

What is saved is the adapter: peft's ``adapter_config.json`` and ``adapter_model.safetensors`` (a
``Trainer`` checkpoint of a peft model holds them in place of the weights), plus ``BASE_FILE``, the
fingerprint of the base's weights it was trained on. Loading it onto a base whose weights differ is
refused, naming both.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import numbers
import warnings
from pathlib import Path
from typing import Any, Mapping

from raymodel.exceptions import CheckpointError, MissingDependencyError, ModelDefinitionError, SettingsError

#: peft's files of an adapter folder.
ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
#: raymodel's note, in an adapter folder, of the base the adapter was trained on.
BASE_FILE = "raymodel_base.json"
#: Module types an adapter can sit beside (their class names: no framework imported to check a name).
_ADAPTABLE = ("Linear", "Conv1D", "Embedding", "Conv2d", "Conv1d")


@dataclasses.dataclass(frozen=True)
class LoRA:
    """A LoRA adapter, declared on a ``RayTransformersModel`` subclass: only the adapter trains.

    Args:
        r: The adapter's rank (the config key ``lora_r`` overrides it).
        alpha: Its scaling numerator (``lora_alpha`` overrides it); ``None``: ``2 * r``.
        dropout: Dropout on the adapter's input.
        target_modules: Names of the modules to adapt (``("c_attn",)``, ``("q_proj", "v_proj")``);
            ``None``: peft's default for the model's architecture (the attention projections).

    Example:
        >>> class Poet(rm.RayTransformersModel):
        ...     lora = rm.LoRA(r=8, target_modules=("c_attn",))
    """

    r: int = 8
    alpha: float | None = None
    dropout: float = 0.0
    target_modules: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        _rank(self.r, "r")
        if self.alpha is not None:
            _alpha(self.alpha, "alpha")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise SettingsError(f"`LoRA(dropout={self.dropout!r})`: dropout is a number in [0, 1).")
        modules = self.target_modules
        if isinstance(modules, str):
            modules = (modules,)
        if modules is not None:
            modules = tuple(modules)
            if not modules or not all(isinstance(m, str) and m for m in modules):
                raise SettingsError(
                    f"`LoRA(target_modules={self.target_modules!r})`: name the modules to adapt, e.g. "
                    "`('c_attn',)` or `('q_proj', 'v_proj')` (or leave it out for the architecture's default)."
                )
        object.__setattr__(self, "target_modules", modules)

    def resolved(self, config: Mapping[str, Any]) -> tuple[int, float]:
        """``(r, alpha)`` of a run of ``config``: its ``lora_r``/``lora_alpha`` over the class's."""
        r = _rank(config.get("lora_r", self.r), "lora_r")
        alpha = config.get("lora_alpha", self.alpha)
        return r, (2.0 * r if alpha is None else _alpha(alpha, "lora_alpha"))


def _rank(value: Any, name: str) -> int:
    """A whole number >= 1 (numpy's integers too: a searcher's ``randint`` gives them)."""
    if not isinstance(value, bool) and isinstance(value, numbers.Integral) and int(value) >= 1:
        return int(value)
    raise SettingsError(f"`{name}={value!r}`: the adapter's rank is a whole number >= 1 (e.g. 8).")


def _alpha(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or value <= 0:
        raise SettingsError(f"`{name}={value!r}`: alpha is a number > 0 (e.g. 16: twice the rank).")
    return float(value)


def declared(model: Any) -> LoRA | None:
    """The class's ``lora``, checked: a ``LoRA`` or ``None``."""
    spec = getattr(type(model), "lora", None)
    if spec is None or isinstance(spec, LoRA):
        return spec
    raise ModelDefinitionError(
        f"`{type(model).__name__}.lora` is a {type(spec).__name__}; declare adapters with `lora = rm.LoRA(r=8)`."
    )


def is_adapted(hf_model: Any) -> bool:
    return hasattr(hf_model, "peft_config") and hasattr(hf_model, "get_base_model")


def require_peft() -> Any:
    try:
        import peft
    except ImportError as exc:
        raise MissingDependencyError(
            "LoRA adapters (`lora = rm.LoRA(...)`) need peft: `pip install 'raymodel[llm]'`."
        ) from exc
    return peft


def wrap(model: Any, spec: LoRA) -> None:
    """``model.model`` (the base ``setup`` built) wrapped with ``spec``'s adapter; the base's weights
    frozen. Names the candidates where a target module is not in the model."""
    peft = require_peft()
    from raymodel.backends.transformers._data import task_of

    hf = model.model
    if is_adapted(hf):
        return  # setup returned an already adapted model (a second `ensure_setup`)
    r, alpha = spec.resolved(model.config)
    targets = spec.target_modules or _default_targets(hf)
    layers = {name: type(module).__name__ for name, module in hf.named_modules() if name}
    candidates = sorted({name.rsplit(".", 1)[-1] for name, kind in layers.items() if kind in _ADAPTABLE})
    for target in targets:
        if not any(name == target or name.endswith(f".{target}") for name in layers):
            raise ModelDefinitionError(
                f"`{type(model).__name__}.lora` targets `{target}`, which `{type(hf).__name__}` does not have; "
                f"its layers an adapter can sit beside: {', '.join(candidates) or '(none)'}."
            )
    conv1d = any(
        kind == "Conv1D" and any(name == t or name.endswith(f".{t}") for t in targets) for name, kind in layers.items()
    )
    task = {"causal_lm": "CAUSAL_LM", "classification": "SEQ_CLS"}.get(task_of(hf))
    config = peft.LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=float(spec.dropout),
        target_modules=list(targets),
        fan_in_fan_out=conv1d,
        task_type=task,
    )
    with warnings.catch_warnings():
        # peft asks the base for `is_gradient_checkpointing`, which transformers 5 deprecated: a warning
        # about peft's own call, in every process that attaches an adapter, naming nothing the user wrote.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated", FutureWarning)
        model.model = peft.get_peft_model(hf, config)


def _default_targets(hf: Any) -> tuple[str, ...]:
    from peft.utils.constants import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as DEFAULTS

    model_type = getattr(getattr(hf, "config", None), "model_type", None)
    if model_type not in DEFAULTS:
        raise ModelDefinitionError(
            f"`LoRA` has no default target modules for a `{model_type}` model; name them: "
            "`rm.LoRA(target_modules=('q_proj', 'v_proj'))`."
        )
    return tuple(DEFAULTS[model_type])


def base_fingerprint(hf_model: Any) -> str:
    """sha256 of the base's weights (names and bytes), the adapter's layers left out: the same for the
    base before and after it is adapted, and after training (the base is frozen)."""
    base = hf_model.get_base_model() if is_adapted(hf_model) else hf_model
    cached = base.__dict__.get("_raymodel_base_fingerprint")
    if cached is not None:
        return str(cached)
    digest = hashlib.sha256()
    for name, tensor in sorted(base.state_dict().items()):
        if "lora_" in name:
            continue
        digest.update(name.replace(".base_layer", "").encode())
        digest.update(tensor.detach().cpu().contiguous().view(-1).view(dtype=_bytes_dtype()).numpy().tobytes())
    if is_adapted(hf_model):  # frozen from here on: computed once
        base.__dict__["_raymodel_base_fingerprint"] = digest.hexdigest()
    return digest.hexdigest()


def _bytes_dtype() -> Any:
    import torch

    return torch.uint8


def save_adapter(model: Any, folder: Path) -> None:
    """peft's adapter folder of ``model`` (and the base's fingerprint) in ``folder``."""
    model.model.save_pretrained(folder)
    note_base(model, folder)


def note_base(model: Any, folder: Path) -> None:
    (Path(folder) / BASE_FILE).write_text(json.dumps({"fingerprint": base_fingerprint(model.model)}))


def load_adapter(model: Any, folder: Path) -> None:
    """The adapter weights of ``folder`` into ``model.model``; refused where the base differs from the
    one the adapter names, or ``folder`` holds a whole model rather than an adapter."""
    folder = Path(folder)
    if not (folder / ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(
            f"`{folder}` holds no LoRA adapter ({ADAPTER_WEIGHTS}), but `{type(model).__name__}` declares "
            "`lora`: load a checkpoint of the adapted model (or remove `lora` to load a whole model)."
        )
    check_base(model, folder)
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    set_peft_model_state_dict(model.model, load_file(str(folder / ADAPTER_WEIGHTS)))


def attach(model: Any, folder: Path, name: str) -> None:
    """The adapter of ``folder`` loaded beside ``model``'s own as ``name`` (one base, several adapters:
    a request picks one by name); refused, as ``load_adapter`` refuses, for another base."""
    folder = Path(folder)
    if not is_adapted(model.model) or not (folder / ADAPTER_WEIGHTS).is_file():
        raise CheckpointError(
            f"`{folder}` holds no LoRA adapter for `{type(model).__name__}`: a route of adapters on one base "
            "serves versions of a class that declares `lora`"
        )
    check_base(model, folder)
    model.model.load_adapter(str(folder), adapter_name=name, is_trainable=False)


def check_base(model: Any, folder: Path) -> None:
    note = Path(folder) / BASE_FILE
    if not note.is_file():
        return  # a plain peft folder from elsewhere: nothing names its base
    named = json.loads(note.read_text()).get("fingerprint")
    built = base_fingerprint(model.model)
    if named != built:
        raise CheckpointError(
            f"This adapter was trained on the base of weights {str(named)[:12]}…, but "
            f"`{type(model).__name__}.setup` built a base of weights {built[:12]}…: an adapter only fits the "
            "base it was trained on. Build that base in `setup` (the same config and weights)."
        )


def merged(hf_model: Any) -> Any:
    """A plain transformers model: the adapter merged into a copy of the base (the model itself stays)."""
    import copy

    return copy.deepcopy(hf_model).merge_and_unload()
