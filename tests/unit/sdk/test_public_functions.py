"""``public=True``: a function's (or a class model method's) synchronous call needs no token; it is declared on the
decorator, checked at once, and travels in the function's spec."""

from __future__ import annotations

import msgspec
import pytest

import ember
from ember.wire import FunctionSpec, Manifest


def test_a_function_is_not_public_unless_it_says_so() -> None:
    app = ember.App("pub")

    @app.function()
    def private(x: int) -> int:
        return x

    @app.function(public=True)
    def open_door(x: int) -> int:
        return x

    assert app.services["private"].functions[0].public is False
    assert app.services["open_door"].functions[0].public is True
    manifest = app.manifest("pub")
    decoded = msgspec.json.decode(msgspec.json.encode(manifest), type=Manifest)
    assert [f.public for s in decoded.services for f in s.functions] == [False, True]


def test_a_class_models_methods_say_it_one_by_one() -> None:
    app = ember.App("pubmodel")

    @app.model()
    class Model:
        @ember.method(public=True)
        def shown(self, x: int) -> int:
            return x

        @ember.method
        def hidden(self, x: int) -> int:
            return x

    assert {f.name: f.public for f in app.services["Model"].functions} == {"Model.shown": True, "Model.hidden": False}


@pytest.mark.parametrize("value", [1, "yes", None, [True]])
def test_public_is_true_or_false(value: object) -> None:
    app = ember.App("pubbad")
    with pytest.raises(ember.InvalidSpecError, match="public is True or False"):
        app.function(public=value)  # type: ignore[call-overload]
    with pytest.raises(ember.InvalidSpecError, match="public is True or False"):
        ember.method(public=value)  # type: ignore[call-overload]


def test_an_older_spec_without_the_field_is_not_public() -> None:
    spec = msgspec.json.decode(b'{"name": "f", "attr": "f", "input_mode": "single"}', type=FunctionSpec)
    assert spec.public is False
