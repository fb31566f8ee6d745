"""Decorated functions and methods keep what the user wrote and run in-process with ``.local()``."""

import inspect

import pytest

import ember
from ember._app import method_def
from ember._setup import run_setup


def _greet(name: str, punctuation: str = "!") -> str:
    """Greets someone."""
    return f"Hello, {name}{punctuation}"


@pytest.fixture
def greet() -> ember.Function:
    return ember.App("hello").function()(_greet)


def test_function_keeps_name_doc_module_and_wrapped(greet: ember.Function) -> None:
    assert greet.__name__ == "_greet"
    assert greet.__qualname__ == "_greet"
    assert greet.__doc__ == "Greets someone."
    assert greet.__module__ == __name__
    assert greet.__wrapped__ is _greet
    assert greet.raw is _greet


def test_function_keeps_signature(greet: ember.Function) -> None:
    assert inspect.signature(greet) == inspect.signature(_greet)


def test_function_local_runs_the_function(greet: ember.Function) -> None:
    assert greet.local("Ada") == "Hello, Ada!"
    assert greet.local("Ada", punctuation="?") == "Hello, Ada?"


def test_function_local_raises_what_the_function_raises() -> None:
    app = ember.App("boom")

    @app.function()
    def fail(x: int) -> int:
        raise ZeroDivisionError(x)

    with pytest.raises(ZeroDivisionError):
        fail.local(1)


def test_function_handle_names(greet: ember.Function) -> None:
    assert isinstance(greet, ember.FunctionHandle)
    assert (greet.app_name, greet.function_name) == ("hello", "_greet")
    assert repr(greet) == "<Function hello._greet>"


def test_calling_the_handle_does_not_run_the_function() -> None:
    # Explicit verbs only: a bare call would hide whether the function runs locally or remotely.
    calls: list[int] = []
    app = ember.App("verbs")

    @app.function()
    def record(x: int) -> int:
        calls.append(x)
        return x

    with pytest.raises(TypeError):
        record(1)  # type: ignore[operator]
    assert calls == []


def test_app_target_is_the_handle() -> None:
    app = ember.App("again")
    handle = app.function()(_greet)
    assert app.target("_greet") is handle


class _Counter:
    setups = 0


def _make_model(app: ember.App) -> type:
    @app.model()
    class Classifier:
        """Classifies."""

        @ember.setup
        def load(self) -> None:
            _Counter.setups += 1
            self.offset = 10

        @ember.method
        def predict(self, x: int) -> int:
            """Predicts."""
            return x + self.offset

        @ember.method(batch=ember.Batch(max_size=4))
        def embed(self, xs: list[int]) -> list[int]:
            return [x * self.offset for x in xs]

    return Classifier


@pytest.fixture
def classifier() -> type:
    _Counter.setups = 0
    return _make_model(ember.App("digits"))


def test_method_handle_names(classifier: type) -> None:
    handle = classifier.predict
    assert isinstance(handle, ember.MethodHandle)
    assert isinstance(handle, ember.FunctionHandle)
    assert handle.function_name == "Classifier.predict"
    assert handle.app_name == "digits"
    assert repr(handle) == "<MethodHandle digits.Classifier.predict>"


def test_method_handle_keeps_doc_and_wrapped(classifier: type) -> None:
    handle = classifier.predict
    assert handle.__doc__ == "Predicts."
    assert handle.__wrapped__ is method_def(classifier, "predict").raw
    assert list(inspect.signature(handle.__wrapped__).parameters) == ["self", "x"]


def test_class_stays_the_users_class(classifier: type) -> None:
    assert inspect.isclass(classifier)
    assert classifier.__name__ == "Classifier"
    assert classifier.__doc__ == "Classifies."


def test_method_local_runs_setup_once(classifier: type) -> None:
    assert classifier.predict.local(1) == 11
    assert classifier.predict.local(x=2) == 12
    assert classifier.embed.local([1, 2]) == [10, 20]
    assert _Counter.setups == 1


def test_method_local_on_an_instance_uses_that_instance(classifier: type) -> None:
    instance = classifier()
    instance.offset = 100
    assert instance.predict.local(1) == 101
    assert _Counter.setups == 0


def test_method_on_an_undecorated_class_has_no_app() -> None:
    class Plain:
        @ember.method
        def predict(self, x: int) -> int:
            return x

    assert Plain.predict.app_name == ""
    assert Plain.predict.function_name == "Plain.predict"


def test_method_handle_follows_the_subclass_name() -> None:
    app = ember.App("models")

    class Base:
        @ember.method
        def predict(self, x: int) -> int:
            return x

    @app.model()
    class Child(Base):
        pass

    assert Child.predict.function_name == "Child.predict"
    assert Child.predict.app_name == "models"
    assert method_def(Child, "predict") is Base.__dict__["predict"]


def test_method_def_of_an_unserved_attribute() -> None:
    class Plain:
        def helper(self) -> None:
            pass

    with pytest.raises(KeyError, match=r"is not an @ember\.method"):
        method_def(Plain, "helper")


def test_run_setup_runs_base_setups_first() -> None:
    calls: list[str] = []

    class Base:
        @ember.setup
        def load_base(self) -> None:
            calls.append("base")

    class Child(Base):
        @ember.setup
        def load_child(self) -> None:
            calls.append("child")

        def not_setup(self) -> None:
            calls.append("plain")

    run_setup(Child())
    assert calls == ["base", "child"]


def test_overridden_setup_runs_once() -> None:
    calls: list[str] = []

    class Base:
        @ember.setup
        def load(self) -> None:
            calls.append("base")

    class Child(Base):
        @ember.setup
        def load(self) -> None:
            calls.append("child")

    run_setup(Child())
    assert calls == ["child"]


def test_lookup_returns_an_untyped_handle() -> None:
    handle = ember.lookup("digits", "Classifier.predict")
    assert type(handle) is ember.FunctionHandle
    assert (handle.app_name, handle.function_name) == ("digits", "Classifier.predict")
