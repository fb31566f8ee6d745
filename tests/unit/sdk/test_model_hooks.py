"""``@ember.teardown`` and ``@ember.health``: what they accept, and the order and failures of ``run_teardown``."""

from __future__ import annotations

import pytest

import ember
from ember._setup import health_check, run_teardown


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


@pytest.mark.parametrize("hook", ["setup", "teardown", "health"])
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

    with pytest.raises(ember.InvalidSpecError, match="another hook"):
        ember.teardown(ember.setup(both))

    def other(self) -> None: ...

    with pytest.raises(ember.InvalidSpecError, match="another hook"):
        ember.setup(ember.teardown(other))


def test_health_takes_a_period_and_a_timeout_in_bounds_and_one_per_class() -> None:
    for bad in [{"every_s": 0}, {"every_s": True}, {"timeout_s": 7200}, {"timeout_s": "5"}, {"failures": 0},
                {"failures": 2.0}, {"failures": True}, {"failures": 101}]:
        with pytest.raises(ember.InvalidSpecError, match=next(iter(bad))):
            ember.health(**bad)  # type: ignore[arg-type]

    class One:
        @ember.health(every_s=2, timeout_s=3)
        def ok(self) -> bool:
            return True

    assert health_check(One) == ("ok", 2.0, 3.0, 3)  # three failed checks in a row, by default
    assert health_check(object) is None
    app = ember.App("hooks")
    with pytest.raises(ember.InvalidSpecError, match=r"2 @ember\.health methods"):
        @app.model()
        class Two(One):
            @ember.health
            def also(self) -> None: ...

            @ember.method()
            def f(self) -> int:
                return 1

    def both(self) -> None: ...

    with pytest.raises(ember.InvalidSpecError, match="another hook"):
        ember.teardown(ember.health(both))


@pytest.mark.parametrize("hook", [ember.setup, ember.teardown, ember.health])
def test_a_hook_is_not_served(hook) -> None:  # type: ignore[no-untyped-def]
    def marked(self) -> None: ...

    hook(marked)
    with pytest.raises(ember.InvalidSpecError, match="a hook that the replica runs itself"):
        ember.App("hooks").function()(marked)
    with pytest.raises(ember.InvalidSpecError, match="a hook that the replica runs itself"):
        ember.method(marked)
