"""A model's declared ``input_schema`` / ``output_schema``: validation with JSON paths, and OpenAPI.

A schema is a pydantic model (or any type pydantic validates, e.g. ``list[list[float]]``) or a
JSON Schema dict. ``preprocess`` receives what the schema validated: a pydantic model's
instance, or the payload itself for a JSON Schema. Each bad field is reported with its JSON path
(``$.pixels[0][3]``), all of them at once.
"""

from __future__ import annotations

from typing import Any, Mapping

from raymodel.exceptions import ModelDefinitionError

COMPONENTS = "#/components/schemas/"


class Schema:
    """One declared schema, compiled once per class."""

    def __init__(self, declared: Any, where: str) -> None:
        self.where = where
        if isinstance(declared, Mapping):
            import jsonschema

            cls = jsonschema.validators.validator_for(declared)
            try:
                cls.check_schema(declared)
            except jsonschema.SchemaError as exc:
                raise ModelDefinitionError(
                    f"`{where}` is not a valid JSON Schema: {exc.message} (at {json_path(exc.absolute_path)})."
                ) from None
            self._validator: Any = cls(declared)
            self._adapter: Any = None
            self.json_schema = dict(declared)
        else:
            from pydantic import TypeAdapter

            try:
                self._adapter = TypeAdapter(declared)
                self.json_schema = self._adapter.json_schema(ref_template=COMPONENTS + "{model}")
            except Exception as exc:  # noqa: BLE001 - pydantic's errors for a type it cannot use vary
                raise ModelDefinitionError(
                    f"`{where}` must be a pydantic model (or a type pydantic validates) "
                    f"or a JSON Schema dict (got {declared!r}: {exc})."
                ) from None
            self._validator = None

    def validate(self, value: Any) -> tuple[Any, list[dict[str, str]]]:
        """``(validated value, [])``, or ``(None, [{"path": ..., "message": ...}, ...])``."""
        if self._adapter is not None:
            from pydantic import ValidationError

            try:
                return self._adapter.validate_python(value), []
            except ValidationError as exc:
                return None, [{"path": json_path(e["loc"]), "message": e["msg"]} for e in exc.errors()]
        errors = sorted(self._validator.iter_errors(value), key=lambda e: list(map(str, e.absolute_path)))
        return value, [{"path": json_path(e.absolute_path), "message": e.message} for e in errors]

    def to_json(self, value: Any) -> Any:
        """A validated value as plain JSON data."""
        return self._adapter.dump_python(value, mode="json") if self._adapter is not None else value


class Schemas:
    """A model class's input and output schemas (either may be ``None``)."""

    def __init__(self, model_cls: type) -> None:
        name = model_cls.__name__
        declared_in = getattr(model_cls, "input_schema", None)
        declared_out = getattr(model_cls, "output_schema", None)
        self.input = None if declared_in is None else Schema(declared_in, f"{name}.input_schema")
        self.output = None if declared_out is None else Schema(declared_out, f"{name}.output_schema")

    def check_input(self, payload: Any) -> tuple[Any, list[dict[str, str]]]:
        return (payload, []) if self.input is None else self.input.validate(payload)

    def check_output(self, output: Any) -> Any:
        """The output as JSON data; a ``ValueError`` naming each field that does not match."""
        if self.output is None:
            return output
        value, errors = self.output.validate(output)
        if errors:
            raise ValueError(f"the output does not match `{self.output.where}`: {describe(errors)}")
        return self.output.to_json(value)


_SCHEMAS: dict[type, Schemas] = {}


def schemas_of(model_cls: type) -> Schemas:
    """The compiled schemas of a model class (once per class)."""
    found = _SCHEMAS.get(model_cls)
    if found is None:
        found = _SCHEMAS[model_cls] = Schemas(model_cls)
    return found


def json_path(parts: Any) -> str:
    """``("pixels", 0, 3)`` -> ``"$.pixels[0][3]"``."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif isinstance(part, str) and part.isidentifier():
            path += f".{part}"
        else:
            path += f"[{str(part)!r}]"
    return path


def describe(errors: list[dict[str, str]], limit: int = 5) -> str:
    text = "; ".join(f"{e['path']}: {e['message']}" for e in errors[:limit])
    return text + (f"; and {len(errors) - limit} more" if len(errors) > limit else "")


def openapi(model_cls: type, route: str, title: str, version: str) -> dict[str, Any]:
    """The OpenAPI 3.1 document of a route: its POST body and answers, and the GET endpoints."""
    schemas = schemas_of(model_cls)
    components: dict[str, Any] = {
        "Error": {
            "type": "object",
            "required": ["error", "detail"],
            "properties": {"error": {"type": "string"}, "detail": {"type": "string"}, "request_id": {"type": "string"}},
        },
        "InvalidPayload": {
            "type": "object",
            "required": ["error", "detail"],
            "properties": {
                "error": {"type": "string"},
                "detail": {"type": "string"},
                "errors": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["path", "message"],
                        "properties": {
                            "path": {"type": "string", "description": "JSON path of the field, e.g. $.pixels[0][3]"},
                            "message": {"type": "string"},
                        },
                    },
                },
            },
        },
    }
    body = _component(schemas.input, components) if schemas.input else {"description": "any JSON (no input_schema)"}
    answer = _component(schemas.output, components) if schemas.output else {"description": "any JSON"}

    def error(description: str, name: str = "Error") -> dict[str, Any]:
        return {"description": description, "content": {"application/json": {"schema": {"$ref": COMPONENTS + name}}}}

    base = route.rstrip("/")
    get = lambda summary: {"get": {"summary": summary, "responses": {"200": {"description": "OK"}}}}  # noqa: E731
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": version},
        "paths": {
            route: {
                "post": {
                    "summary": f"Predict with {model_cls.__name__}",
                    "requestBody": {"required": True, "content": {"application/json": {"schema": body}}},
                    "responses": {
                        "200": {"description": "The prediction", "content": {"application/json": {"schema": answer}}},
                        "400": error("The body is not JSON"),
                        "413": error("The body is too large"),
                        "422": error(
                            "The payload does not match the input schema, or preprocess refused it", "InvalidPayload"
                        ),
                        "500": error("The model failed on this request"),
                    },
                }
            },
            f"{base}/health": get("Liveness"),
            f"{base}/info": get("What is served: class, backend, version, batching"),
            f"{base}/openapi.json": get("This document"),
        },
        "components": {"schemas": components},
    }


def _component(schema: Schema, components: dict[str, Any]) -> dict[str, Any]:
    """The schema with its definitions moved into ``components`` (refs rewritten to point there)."""
    document = dict(schema.json_schema)
    for key in ("$defs", "definitions"):
        for name, definition in document.pop(key, {}).items():
            components[name] = _rewrite(definition, key)
        document = _rewrite(document, key)
    return document


def _rewrite(node: Any, key: str) -> Any:
    if isinstance(node, dict):
        return {
            k: (
                COMPONENTS + v[len(f"#/{key}/") :]
                if k == "$ref" and isinstance(v, str) and v.startswith(f"#/{key}/")
                else _rewrite(v, key)
            )
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_rewrite(v, key) for v in node]
    return node
