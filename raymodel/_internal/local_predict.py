"""``model.predict(payload)`` in this process: the request checks a route makes (the declared schemas,
the recorded input signature), then ``postprocess(forward(preprocess(payload)))`` in inference mode.
No Ray: a model predicts locally without starting or importing it."""

from __future__ import annotations

from typing import Any

from raymodel._internal import signature
from raymodel._internal.schema import describe, schemas_of
from raymodel.exceptions import DataError


def predict_one(model: Any, payload: Any) -> Any:
    """``model``'s answer to ``payload`` (``RayModel.predict``); ``DataError`` names what does not fit."""
    schemas = schemas_of(type(model))
    model.ensure_setup()
    checked, errors = schemas.check_input(payload)
    if errors:
        where = schemas.input.where if schemas.input is not None else "the input schema"
        raise DataError(f"The payload does not match `{where}`: {describe(errors)}")
    try:
        signature.check_payload(payload)
        x = model.preprocess(checked)
    except DataError:
        raise
    except Exception as exc:
        raise DataError(
            f"`{type(model).__name__}.preprocess` cannot use the payload {short(payload)} "
            f"(a {type(payload).__name__}): {type(exc).__name__}: {exc}"
        ) from exc
    if schemas.input is None:  # a declared input_schema wins over the recorded (or the model's own) signature
        signature.check(signature.of_model(model), x)
    with model.backend.inference(model):
        try:
            out = model.forward(x)
        except Exception as exc:
            exc.add_note(
                f"raymodel: `forward` failed on the input made from the payload {short(payload)} "
                f"(a {type(payload).__name__})."
            )
            raise
    output = model.postprocess(out)
    if schemas.output is not None:
        schemas.check_output(output)  # raises, naming each field that does not match
    return output


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)``, cut to ``limit`` characters (for error messages)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
