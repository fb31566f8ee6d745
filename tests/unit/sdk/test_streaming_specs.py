"""What the decorators record of generators, async functions and max_concurrency, and what they refuse."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Iterator

import msgspec
import pytest

import ember
from ember.wire import LoadReport
from ember.wire.validate import manifest_problems
from ember_platform.calls.choice import choose
from ember_platform.gateway.streaming import mode_of
from ember_platform.scheduler.autoscale import in_flight_target


def test_a_generator_streams_and_its_schema_is_its_items():
    app = ember.App("g")

    @app.function(max_concurrency=4)
    def tokens(prompt: str) -> Iterator[str]:
        yield prompt

    @app.function
    async def atokens(prompt: str) -> AsyncIterator[int]:
        yield 1

    spec, aspec = app.services["tokens"].functions[0], app.services["atokens"].functions[0]
    assert (spec.stream, spec.is_async, spec.max_concurrency) == (True, False, 4)
    assert (aspec.stream, aspec.is_async, aspec.max_concurrency) == (True, True, 1)
    assert spec.output_schema == {"type": "string"} and aspec.output_schema == {"type": "integer"}
    assert tokens._io.stream and tokens._io.decode_output(b'["a","b"]') == ["a", "b"]  # a whole result is a list


def test_async_functions_and_methods_are_marked():
    app = ember.App("a")

    @app.function
    async def f(x: int) -> int:
        return x

    @app.model(max_concurrency=16)
    class M:
        @ember.method
        async def g(self, x: int) -> int:
            return x

        @ember.method
        def h(self, x: int) -> Iterator[int]:
            yield x

    assert app.services["f"].functions[0].is_async and not app.services["f"].functions[0].stream
    g, h = app.services["M"].functions
    assert (g.is_async, g.stream, g.max_concurrency) == (True, False, 16)
    assert (h.is_async, h.stream, h.max_concurrency) == (False, True, 16)


@pytest.mark.parametrize("value", [0, -1, 1025, 2.5, True, "8", None])
def test_max_concurrency_is_an_int_from_1_to_1024(value):
    app = ember.App("c")
    with pytest.raises(ember.InvalidSpecError, match="max_concurrency"):
        app.function(max_concurrency=value)
    with pytest.raises(ember.InvalidSpecError, match="max_concurrency"):
        app.model(max_concurrency=value)


def test_a_generator_cannot_be_batched():
    app = ember.App("b")
    with pytest.raises(ember.InvalidSpecError, match="cannot be batched"):
        @app.function(batch=ember.Batch(max_size=4))
        def g(xs: list[int]) -> Iterator[int]:
            yield from xs

    with pytest.raises(ember.InvalidSpecError, match="cannot be batched"):
        @ember.method(batch=ember.Batch(max_size=4))
        async def h(self, xs: list[int]) -> AsyncIterator[int]:
            yield 1


def test_a_generator_annotated_with_something_else_is_refused():
    app = ember.App("r")
    with pytest.raises(ember.InvalidSpecError, match=r"Iterator\[Item\]"):
        @app.function
        def g(n: int) -> list[int]:  # a generator that claims to return a list
            yield n


def test_the_platform_checks_what_a_manifest_claims():
    app = ember.App("m")

    @app.function
    def g(n: int) -> Iterator[int]:
        yield n

    manifest = app.manifest("m")
    fn = manifest.services[0].functions[0]
    for bad, field in [(msgspec.structs.replace(fn, max_concurrency=0), "max_concurrency"),
                       (msgspec.structs.replace(fn, max_concurrency=5000), "max_concurrency"),
                       (msgspec.structs.replace(fn, batch=ember.Batch()), "batch")]:
        svc = msgspec.structs.replace(manifest.services[0], functions=[bad])
        problems = list(manifest_problems(msgspec.structs.replace(manifest, services=[svc])))
        assert [p for p, _ in problems] == [f"$.manifest.services[0].functions[0].{field}"]


@pytest.mark.parametrize(("accept", "mode"), [
    (None, "ndjson"), ("", "ndjson"), ("*/*", "ndjson"), ("application/x-ndjson", "ndjson"),
    ("text/event-stream", "sse"), ("TEXT/EVENT-STREAM; charset=utf-8", "sse"), ("application/json", "json"),
    ("application/json, */*", "ndjson"), ("text/event-stream;q=0, application/json", "json"),
    ("garbage;;;,,,", "ndjson"), ("a/b, " * 40 + "text/event-stream", "ndjson"),  # past the first 32 types
])
def test_the_answer_format_follows_accept(accept, mode):
    assert mode_of(accept) == mode


def test_the_router_compares_replicas_by_their_slots():
    def report(replica: str, in_flight: int, slots: int) -> LoadReport:
        return LoadReport(replica_id=replica, app="a", function="f", version=1, queued=0, in_flight=in_flight,
                          per_call_s=0.0, slots=slots)

    wide, narrow = report("wide", 6, 32), report("narrow", 1, 1)
    assert all(choose([wide, narrow], {}, random.Random(seed)) == "wide" for seed in range(10))


def test_the_autoscaler_aims_at_most_slots_busy():
    assert in_flight_target(1) == 2.0  # as before
    assert in_flight_target(32) == pytest.approx(25.6)
