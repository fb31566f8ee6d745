"""``@ember.teardown``: what it accepts, and the order and failures of ``run_teardown``."""

from __future__ import annotations

import pytest

import ember
from ember._setup import run_teardown


def test_teardowns_run_subclass_first_each_class_in_its_order_and_past_a_failure() -> None:
    ran: list[str] = []

    class Base:
        @ember.teardown
        def close_base(self) -> None:
            ran.append("base")

        @ember.teardown
        def replaced(self) -> None:
            ran.append("base-replaced")

    class Child(Base):
        @ember.teardown
        def first(self) -> None:
            ran.append("first")
            raise OSError("flush failed")

        @ember.teardown
        def second(self) -> None:
            ran.append("second")

        def replaced(self) -> None:  # overrides the base's teardown with a plain method: neither runs as one
            ran.append("child-replaced")

        @ember.setup
        def load(self) -> None:
            ran.append("setup")

    failed = run_teardown(Child())
    assert ran == ["first", "second", "base"]
    assert [(name, type(exc), str(exc)) for name, exc in failed] == [("first", OSError, "flush failed")]
    assert run_teardown(object()) == []


@pytest.mark.parametrize("hook", ["setup", "teardown"])
def test_a_hook_is_a_plain_method_taking_only_self(hook: str) -> None:
    decorate = getattr(ember, hook)

    async def coroutine(self) -> None: ...

    def generator(self):  # type: ignore[no-untyped-def]
        yield

    def two(self, x) -> None: ...  # type: ignore[no-untyped-def]

    for raw, said in [(coroutine, "plain method"), (generator, "plain method"), (two, "takes only `self`"),
                      (staticmethod(lambda: None), "decorates a method")]:
        with pytest.raises(ember.InvalidSpecError, match=said):
            decorate(raw)


def test_a_method_is_not_both_setup_and_teardown() -> None:
    def both(self) -> None: ...

    with pytest.raises(ember.InvalidSpecError, match="both"):
        ember.teardown(ember.setup(both))

    def other(self) -> None: ...

    with pytest.raises(ember.InvalidSpecError, match="both"):
        ember.setup(ember.teardown(other))
