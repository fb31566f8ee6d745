"""The gateway's fast validator (msgspec types rebuilt from JSON Schema) accepts exactly what the
schema accepts, names the same field, and declines schemas outside its subset."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
import pytest
from jsonschema import Draft202012Validator

from ember._errors import InvalidInputError
from ember.wire import FunctionSpec
from ember_platform.gateway.body import InputValidator
from ember_platform.gateway.schema import decoder_for

Pixel = Annotated[float, msgspec.Meta(ge=0, le=16)]


class Image(msgspec.Struct):
    pixels: Annotated[list[Pixel], msgspec.Meta(min_length=2, max_length=3)]
    label: int | None = None


class Request(msgspec.Struct, forbid_unknown_fields=True):
    image: Image
    mode: Literal["fast", "exact"] = "fast"
    tags: dict[str, str] = {}
    name: Annotated[str, msgspec.Meta(min_length=1, max_length=20)] = "x"  # a pattern: see test_schema_patterns
    weight: float | int | None = None


CASES: list[tuple[Any, list[Any]]] = [
    (str, ["a", "", 1, None, [], {}]),
    (int, [1, -5, 1.5, "1", True, None]),
    (float, [1, 1.5, "x", None]),
    (Annotated[int, msgspec.Meta(ge=0, lt=10)], [0, 9, 10, -1]),
    (list[int], [[], [1, 2], [1, "2"], {}, None]),
    (dict[str, int], [{}, {"a": 1}, {"a": "1"}, []]),
    (Image, [{"pixels": [1, 2]}, {"pixels": [1]}, {"pixels": [1, 2, 3, 4]}, {"pixels": [1, 99]},
             {"pixels": [1, 2], "label": 3}, {"pixels": [1, 2], "label": "3"}, {"label": 3},
             {"pixels": [1, 2], "x": 1}]),
    (Request, [{"image": {"pixels": [1, 2]}}, {"image": {"pixels": [1, 2]}, "mode": "exact"},
               {"image": {"pixels": [1, 2]}, "mode": "slow"}, {"image": {"pixels": [1, 2]}, "extra": 1},
               {"image": {"pixels": [1, 2]}, "tags": {"a": "b"}}, {"image": {"pixels": [1, 2]}, "tags": {"a": 1}},
               {"image": {"pixels": [1, 2]}, "name": "Abc"}, {"image": {"pixels": [1, 2]}, "name": ""},
               {"image": {"pixels": [1, 2]}, "weight": 2}, {"image": {"pixels": [1, 2]}, "weight": "2"}, {}]),
    (Literal["a", "b"] | None, ["a", "c", None]),
]


@pytest.mark.parametrize(("tp", "values"), CASES, ids=[str(i) for i in range(len(CASES))])
def test_accepts_exactly_what_the_schema_accepts(tp: Any, values: list[Any]) -> None:
    schema = msgspec.json.schema(tp)
    decoder = decoder_for(schema)
    assert decoder is not None, f"not converted: {schema}"
    reference = Draft202012Validator(schema)
    for value in values:
        data = msgspec.json.encode(value)
        try:
            decoder.decode(data)
            fast_ok = True
        except msgspec.ValidationError:
            fast_ok = False
        assert fast_ok == reference.is_valid(value), (schema, value)


def test_a_missing_or_unknown_key_is_named() -> None:
    validator = InputValidator(FunctionSpec(name="f", attr="f", input_mode="single",
                                            input_schema=msgspec.json.schema(Request)))
    with pytest.raises(InvalidInputError) as missing:
        validator.check(b'{"image": {}}')
    assert missing.value.field == "$.image.pixels"
    with pytest.raises(InvalidInputError) as unknown:
        validator.check(b'{"image": {"pixels": [1, 2]}, "zzz": 1}')
    assert unknown.value.field == "$.zzz"
    with pytest.raises(InvalidInputError) as bounded:
        validator.check(b'{"image": {"pixels": [1, 17]}}')
    assert bounded.value.field == "$.image.pixels[1]"


@pytest.mark.parametrize("schema", [
    {"type": "string", "format": "date-time"},
    {"type": "array", "prefixItems": [{"type": "integer"}]},
    {"$ref": "#/$defs/Node", "$defs": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/$defs/Node"}}}}},
    {"not": {"type": "string"}},
])
def test_schemas_outside_the_subset_take_the_generic_path(schema: dict[str, Any]) -> None:
    assert decoder_for(schema) is None
    validator = InputValidator(FunctionSpec(name="f", attr="f", input_mode="single", input_schema=schema))
    assert validator._fast is None and validator._schema is not None
