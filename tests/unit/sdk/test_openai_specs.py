"""``openai=`` at decoration: a generator of text pieces or a function of an embeddings request is served, anything
else is refused naming both kinds; the manifest's check agrees."""

from __future__ import annotations

from collections.abc import Iterator

import msgspec
import pytest

import ember
from ember.wire.validate import manifest_problems


def _app() -> ember.App:
    return ember.App("specs")


def test_a_generator_and_an_embeddings_function_are_served() -> None:
    app = _app()

    @app.function(openai="texts")
    def texts(req: ember.openai.ChatRequest) -> Iterator[str]:
        yield "x"

    @app.function(openai="vectors")
    def vectors(req: ember.openai.EmbeddingRequest) -> list[list[float]]:
        return [[1.0] for _ in req.texts]

    @app.model()
    class Vectors:
        @ember.method(openai="batched-vectors", batch=ember.Batch(max_size=4))
        def embed(self, reqs: list[ember.openai.EmbeddingRequest]) -> list[list[list[float]]]:
            return [[[1.0]] for _ in reqs]

    specs = {fn.openai: fn for svc in app.manifest("specs").services for fn in svc.functions}
    assert specs["texts"].stream and not specs["vectors"].stream and not specs["batched-vectors"].stream
    assert list(manifest_problems(app.manifest("specs"))) == []


@pytest.mark.parametrize("annotation", [str, ember.openai.ChatRequest, dict])
def test_a_plain_function_of_anything_else_is_refused(annotation: type) -> None:
    def plain(req):  # type: ignore[no-untyped-def]
        return [[1.0]]

    plain.__annotations__ = {"req": annotation, "return": list[list[float]]}
    with pytest.raises(ember.InvalidSpecError, match="a function of an embeddings request"):
        _app().function(openai="wrong")(plain)


def test_the_manifest_refuses_an_openai_function_of_several_inputs() -> None:
    app = _app()

    @app.function(openai="vectors")
    def vectors(req: ember.openai.EmbeddingRequest) -> list[list[float]]:
        return [[1.0]]

    manifest = app.manifest("specs")
    fn = manifest.services[0].functions[0]
    broken = msgspec.structs.replace(manifest, services=[msgspec.structs.replace(
        manifest.services[0], functions=[msgspec.structs.replace(fn, input_mode="kwargs")])])
    assert [field for field, _ in manifest_problems(broken)] == ["$.manifest.services[0].functions[0].openai"]
