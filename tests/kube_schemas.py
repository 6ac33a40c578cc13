"""KubeRay's CRD schemas (tests/kuberay/schemas.json.gz) as strict JSON schemas, the way ``kubeconform
-strict`` reads a CRD: an object whose schema lists its properties takes no other (unless the schema
says ``x-kubernetes-preserve-unknown-fields``), ``x-kubernetes-int-or-string`` is an integer or a
string, ``nullable`` allows null."""

from __future__ import annotations

import functools
import gzip
import json
from pathlib import Path
from typing import Any

import jsonschema

HERE = Path(__file__).resolve().parent / "kuberay"


@functools.cache
def schemas() -> dict[str, Any]:
    with gzip.open(HERE / "schemas.json.gz") as fh:
        return {kind: strict(schema) for kind, schema in json.load(fh).items()}


def strict(node: Any) -> Any:
    """``node`` (an OpenAPI v3 schema of a CRD) as a strict JSON schema."""
    if isinstance(node, list):
        return [strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: strict(value) for key, value in node.items() if not key.startswith("x-kubernetes-")}
    if node.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if node.get("nullable"):
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
    out.pop("nullable", None)
    if (
        "properties" in node
        and "additionalProperties" not in node
        and not node.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def problems(manifest: dict[str, Any]) -> list[str]:
    """What KubeRay's schema for the manifest's kind refuses in it, strictly; ``[]`` for none."""
    schema = schemas()[manifest["kind"]]
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, error.absolute_path))}: {error.message}" for error in validator.iter_errors(manifest)]
