"""Declared `input_schema` / `output_schema` without a cluster: local `predict`, JSON paths, OpenAPI, bad declarations.

Over HTTP (422 with paths, `GET <route>/openapi.json`, a 500 for a bad output): `test_serve.py`.
"""

from __future__ import annotations

import pytest
from models import RowsNet, TinyNet, TypedDigitsNet
from pydantic import BaseModel

import raymodel as rm
from raymodel.contract.schema import json_path, openapi, schemas_of


def test_local_predict_checks_the_schemas_like_the_server():
    model = TypedDigitsNet(config={"hidden": 4})
    assert model.predict({"pixels": [[0.0] * 64]}).digit[0] in range(10)  # preprocess got a `Pixels`
    with pytest.raises(rm.DataError, match=r"does not match `TypedDigitsNet.input_schema`: \$.pixels\[0\]\[1\]"):
        model.predict({"pixels": [[0.0, "x"]]})
    with pytest.raises(ValueError, match=r"output_schema`: \$.digit\[0\]: Input should be a valid integer"):
        model.predict({"pixels": [[0.0] * 64] * 3})  # three rows: this test model's broken answer
    rows = RowsNet()
    assert len(rows.predict([[1, 2, 3, 4]])) == 1
    with pytest.raises(rm.DataError, match=r"\$\[0\]: \[1, 2\] is too short"):
        rows.predict([[1, 2]])
    assert TinyNet().predict([[1, 2, 3, 4]])  # no schema: any JSON reaches preprocess, as before


def test_json_paths():
    assert json_path(()) == "$"
    assert json_path(("pixels", 0, 3)) == "$.pixels[0][3]"
    assert json_path(("a b", "x")) == "$['a b'].x"


def test_openapi_moves_nested_definitions_into_components():
    class Point(BaseModel):
        x: float
        y: float

    class Shape(BaseModel):
        points: list[Point]

    class ShapeNet(TinyNet):
        input_schema = Shape
        output_schema = list[float]

    spec = openapi(ShapeNet, "/shapes", "ShapeNet", "1")
    body = spec["paths"]["/shapes"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert body["properties"]["points"]["items"] == {"$ref": "#/components/schemas/Point"}
    assert spec["components"]["schemas"]["Point"]["required"] == ["x", "y"]
    answer = spec["paths"]["/shapes"]["post"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert answer == {"type": "array", "items": {"type": "number"}}

    class Plain(TinyNet):
        pass

    plain = openapi(Plain, "/", "Plain", "1")["paths"]["/"]["post"]["requestBody"]["content"]["application/json"]
    assert plain["schema"] == {"description": "any JSON (no input_schema)"}


def test_a_bad_declaration_fails_before_anything_is_served():
    class NotASchema(TinyNet):
        input_schema = object()

    class BadJsonSchema(TinyNet):
        output_schema = {"type": "no-such-type"}

    with pytest.raises(rm.ModelDefinitionError, match="`NotASchema.input_schema` must be a pydantic model"):
        NotASchema().serve("/never")
    with pytest.raises(rm.ModelDefinitionError, match="`BadJsonSchema.output_schema` is not a valid JSON Schema"):
        schemas_of(BadJsonSchema)
