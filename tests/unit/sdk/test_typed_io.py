"""``CallIO``: a call's Python arguments to a JSON body and back, typed by the function's annotations."""

from collections.abc import Callable
from typing import Any

import msgspec
import pytest
from jsonschema import Draft202012Validator

import ember
from ember._types import CallIO


class Point(msgspec.Struct):
    x: float
    y: float


class Image(msgspec.Struct):
    pixels: list[float]
    label: str | None = None


def _io(fn: Callable[..., Any], *, batched: bool = False, is_method: bool = False) -> CallIO:
    return CallIO.of(fn, batched=batched, is_method=is_method)


def _roundtrip(io: CallIO, *args: Any, **kwargs: Any) -> tuple[tuple[Any, ...], dict[str, Any]]:
    return io.decode_input(io.encode_args(args, kwargs))


# --- modes -------------------------------------------------------------------------------------


def test_mode_none() -> None:
    def ping() -> str:
        return "pong"

    io = _io(ping)
    assert (io.mode, io.params, io.input_type) == ("none", [], None)
    assert io.encode_args((), {}) == b"{}"
    assert io.decode_input(b"{}") == ((), {})
    assert io.decode_input(b"") == ((), {})
    assert io.input_schema() == {}
    assert io.output_schema() == {"type": "string"}


def test_mode_none_refuses_arguments() -> None:
    def ping() -> str:
        return "pong"

    with pytest.raises(TypeError, match="takes no arguments"):
        _io(ping).encode_args((1,), {})
    with pytest.raises(TypeError, match="takes no arguments"):
        _io(ping).encode_args((), {"x": 1})


def test_mode_single() -> None:
    def greet(name: str) -> str:
        return name

    io = _io(greet)
    assert (io.mode, io.params, io.input_type, io.output_type) == ("single", ["name"], str, str)
    assert io.encode_args(("Ada",), {}) == b'"Ada"'
    assert io.encode_args((), {"name": "Ada"}) == b'"Ada"'
    assert io.decode_input(b'"Ada"') == (("Ada",), {})


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), (("a", "b"), {}), ((), {"other": "a"}),
                                               (("a",), {"name": "b"})])
def test_mode_single_refuses_wrong_arguments(args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    def greet(name: str) -> str:
        return name

    with pytest.raises(TypeError, match="expected one argument, 'name'"):
        _io(greet).encode_args(args, kwargs)


def test_mode_kwargs() -> None:
    def add(a: int, b: int = 0) -> int:
        return a + b

    io = _io(add)
    assert (io.mode, io.params) == ("kwargs", ["a", "b"])
    assert io.encode_args((1, 2), {}) == b'{"a":1,"b":2}'
    assert io.encode_args((1,), {}) == b'{"a":1}'


@pytest.mark.parametrize(("args", "kwargs", "expected"), [
    ((1,), {}, {"a": 1, "b": 0}),
    ((1, 2), {}, {"a": 1, "b": 2}),
    ((), {"a": 3, "b": 4}, {"a": 3, "b": 4}),
    ((5,), {"b": 6}, {"a": 5, "b": 6}),
])
def test_mode_kwargs_roundtrip_fills_defaults(args: tuple[Any, ...], kwargs: dict[str, Any],
                                              expected: dict[str, int]) -> None:
    def add(a: int, b: int = 0) -> int:
        return a + b

    io = _io(add)
    decoded_args, decoded_kwargs = _roundtrip(io, *args, **kwargs)
    assert decoded_args == ()
    assert decoded_kwargs == expected
    assert add(**decoded_kwargs) == add(*args, **kwargs)


def test_mode_kwargs_refuses_arguments_the_signature_refuses() -> None:
    def add(a: int, b: int = 0) -> int:
        return a + b

    with pytest.raises(TypeError):
        _io(add).encode_args((1, 2, 3), {})
    with pytest.raises(TypeError):
        _io(add).encode_args((), {"c": 1})


def test_method_drops_self() -> None:
    class Model:
        def predict(self, x: int) -> str:
            return str(x)

    io = _io(Model.predict, is_method=True)
    assert (io.mode, io.params, io.input_type) == ("single", ["x"], int)
    assert list(io.signature.parameters) == ["x"]


def test_unannotated_parameters_are_any() -> None:
    def f(x):  # type: ignore[no-untyped-def]
        return x

    io = _io(f)
    assert io.input_type is Any
    assert _roundtrip(io, {"free": [1, "form"]}) == (({"free": [1, "form"]},), {})


# --- round-trips -------------------------------------------------------------------------------


@pytest.mark.parametrize(("annotation", "value"), [
    (int, 42),
    (float, 2.5),
    (str, "héllo"),
    (bool, True),
    (list[int], [1, 2, 3]),
    (dict[str, float], {"a": 1.0}),
    (tuple[int, str], (1, "a")),
    (int | None, None),
    (Point, Point(3.0, 4.0)),
    (list[Point], [Point(0.0, 1.0)]),
    (Image, Image(pixels=[0.0, 0.5], label="seven")),
])
def test_single_roundtrip(annotation: Any, value: Any) -> None:
    def f(v):  # type: ignore[no-untyped-def]
        return v

    f.__annotations__ = {"v": annotation, "return": annotation}
    io = _io(f)
    ((decoded,), kwargs) = _roundtrip(io, value)
    assert kwargs == {}
    assert decoded == value
    assert type(decoded) is type(value)
    assert io.decode_output(msgspec.json.encode(value)) == value


def test_multi_argument_roundtrip_with_structs_and_defaults() -> None:
    def classify(image: Image, top_k: int = 3, threshold: float = 0.5, *, tags: list[str] | None = None) -> str:
        return ""

    io = _io(classify)
    assert io.mode == "kwargs"
    image = Image(pixels=[0.1, 0.2])
    assert _roundtrip(io, image) == ((), {"image": image, "top_k": 3, "threshold": 0.5, "tags": None})
    assert _roundtrip(io, image, 5, tags=["x"]) == ((), {"image": image, "top_k": 5, "threshold": 0.5,
                                                        "tags": ["x"]})


def test_decode_output_checks_the_type() -> None:
    def f(x: int) -> Point:
        return Point(x, x)

    io = _io(f)
    assert io.decode_output(b'{"x":1,"y":2}') == Point(1.0, 2.0)
    with pytest.raises(msgspec.ValidationError):
        io.decode_output(b'{"x":1}')


def test_single_keyword_only_parameter_roundtrip() -> None:
    def greet(*, name: str) -> str:
        return f"Hello, {name}"

    args, kwargs = _roundtrip(_io(greet), name="Ada")
    assert greet(*args, **kwargs) == "Hello, Ada"


def test_positional_only_parameters_roundtrip() -> None:
    def add(a: int, b: int, /) -> int:
        return a + b

    args, kwargs = _roundtrip(_io(add), 1, 2)
    assert add(*args, **kwargs) == 3


# --- decode errors -----------------------------------------------------------------------------


def _classify(image: Image) -> str:
    return ""


def _add(a: int, b: int = 0) -> int:
    return a + b


@pytest.mark.parametrize(("fn", "body", "message", "field"), [
    (_classify, b'{"pixels": [0.0, 1.0, 2.0, "x"]}', "Expected `float`, got `str`", "$.pixels[3]"),
    (_classify, b'{"pixels": [], "label": 7}', "Expected `str | null`, got `int`", "$.label"),
    (_classify, b'{"label": "a"}', "Object missing required field `pixels`", "$.pixels"),
    (_classify, b"[1, 2]", "Expected `object`, got `array`", "$"),
    (_add, b'{"a": "one"}', "Expected `int`, got `str`", "$.a"),
    (_add, b'{"a": 1, "c": 2}', "Object contains unknown field `c`", "$.c"),
    (_add, b'{"b": 1}', "Object missing required field `a`", "$.a"),
    (_add, b"", "Expected `object`, got `null`", "$"),
])
def test_decode_errors_name_the_field(fn: Callable[..., Any], body: bytes, message: str, field: str) -> None:
    with pytest.raises(ember.InvalidInputError) as info:
        _io(fn).decode_input(body)
    err = info.value
    assert err.message == message
    assert err.field is not None and err.field.strip("`") == field
    assert err.http_status == 422
    assert isinstance(err.__cause__, msgspec.ValidationError)


def test_decode_error_field_is_a_bare_path() -> None:
    with pytest.raises(ember.InvalidInputError) as info:
        _io(_classify).decode_input(b'{"pixels": [0.0, 1.0, 2.0, "x"]}')
    assert info.value.field == "$.pixels[3]"


@pytest.mark.parametrize("body", [b'{"pixels": [', b"not json", b'{"pixels": [1]}}'])
def test_malformed_json_is_invalid_input(body: bytes) -> None:
    with pytest.raises(ember.InvalidInputError, match="malformed JSON"):
        _io(_classify).decode_input(body)


def test_too_deeply_nested_json_is_invalid_input() -> None:
    def f(x: Any) -> int:
        return 0

    with pytest.raises(ember.InvalidInputError, match="malformed JSON: maximum recursion depth"):
        _io(f).decode_input(b"[" * 100_000 + b"]" * 100_000)


def test_empty_body_is_null_for_optional_inputs() -> None:
    def f(x: int | None) -> int:
        return 0

    assert _io(f).decode_input(b"") == ((None,), {})


# --- batched -----------------------------------------------------------------------------------


def test_batched_item_types() -> None:
    def norms(points: list[Point]) -> list[float]:
        return [0.0 for _ in points]

    io = _io(norms, batched=True)
    assert (io.mode, io.params, io.input_type, io.output_type) == ("single", ["points"], Point, float)
    assert io.decode_item(b'{"x": 1, "y": 2}') == Point(1.0, 2.0)
    assert io.input_schema() == msgspec.json.schema(Point)
    assert io.output_schema() == {"type": "number"}
    with pytest.raises(ember.InvalidInputError) as info:
        io.decode_item(b'{"x": 1, "y": "2"}')
    assert info.value.field is not None and info.value.field.strip("`") == "$.y"


def test_batched_bare_list_is_any() -> None:
    def echo(items: list) -> list:  # type: ignore[type-arg]
        return items

    io = _io(echo, batched=True)
    assert (io.input_type, io.output_type) == (Any, Any)
    assert io.decode_item(b'{"k": [1]}') == {"k": [1]}


def test_batched_method_drops_self() -> None:
    class Model:
        def embed(self, texts: list[str]) -> list[list[float]]:
            return [[0.0] for _ in texts]

    io = _io(Model.embed, batched=True, is_method=True)
    assert (io.params, io.input_type, io.output_type) == (["texts"], str, list[float])


# --- schemas -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fn", [_classify, _add])
def test_input_schema_is_a_json_schema(fn: Callable[..., Any]) -> None:
    Draft202012Validator.check_schema(_io(fn).input_schema())
    Draft202012Validator.check_schema(_io(fn).output_schema())


@pytest.mark.parametrize(("fn", "value"), [
    (_add, {"a": 1}),
    (_add, {"a": 1, "b": 2}),
    (_add, {"a": "1"}),
    (_add, {"b": 2}),
    (_add, {"a": 1, "c": 2}),
    (_add, [1]),
    (_classify, {"pixels": [0.5, 1]}),
    (_classify, {"pixels": [0.5], "label": None}),
    (_classify, {"pixels": [0.5], "extra": True}),
    (_classify, {"pixels": ["x"]}),
    (_classify, {"pixels": [0.5], "label": 3}),
    (_classify, {}),
])
def test_input_schema_agrees_with_the_decoder(fn: Callable[..., Any], value: Any) -> None:
    io = _io(fn)
    by_schema = Draft202012Validator(io.input_schema()).is_valid(value)
    try:
        io.decode_input(msgspec.json.encode(value))
        by_decoder = True
    except ember.InvalidInputError:
        by_decoder = False
    assert by_schema == by_decoder


def test_kwargs_schema_names_required_parameters_and_defaults() -> None:
    schema = _io(_add).input_schema()
    (definition,) = schema["$defs"].values()
    assert definition["required"] == ["a"]
    assert definition["properties"]["b"] == {"type": "integer", "default": 0}
    assert definition["additionalProperties"] is False
