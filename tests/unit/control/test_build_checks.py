"""A build's manifest against the one the pushing machine declared: what a node may change (locks, what only the
image's packages tell of a function's types, the interpreter's versions) and what it may not (every other field)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from ember._errors import InvalidInputError
from ember._resources import GpuRequest
from ember.wire import Manifest
from ember.wire.images import ImageSpec, image_hash
from ember.wire.specs import Batch, FunctionSpec, ServiceSpec
from ember.wire.tensors import TensorMeta, TensorSignature
from ember.wire.volumes import VolumeMount
from ember_platform.control.build_checks import check_declared, manifest_difference

IMAGE = ImageSpec(packages=["emberprobe==1.0", "other>=2 ; python_version < '3.0'"], env={"GREETING": "hi"},
                  find_links=["/srv/wheels"], no_index=True)
LOCK = "emberprobe==1.0 \\\n    --hash=sha256:" + "a" * 64 + "\n"


def _locked(image: ImageSpec = IMAGE, lock: str = LOCK, python: str = "3.11") -> ImageSpec:
    locked = msgspec.structs.replace(image, lock=lock, python=python)
    return msgspec.structs.replace(locked, sha256=image_hash(locked))


def _declared() -> Manifest:
    report = FunctionSpec(name="report", attr="report", input_mode="single", params=["x"],
                          input_schema={"type": "object"}, output_schema={"type": "object"},
                          on=["events.probe.in"], result_subject="events.probe.out")
    predict = FunctionSpec(name="Model.predict", attr="predict", input_mode="kwargs", params=["a"],
                           batch=Batch(max_size=8))
    return Manifest(app="probe", module="probe_app", sdk_version="0.1.0", python="3.12", calls=["helper"], services=[
        ServiceSpec(name="report", kind="function", functions=[report], secrets=["probe-db"], image=IMAGE,
                    volumes=[VolumeMount(path="/weights", name="probe-weights")], min_replicas=1, max_replicas=3),
        ServiceSpec(name="Model", kind="class", functions=[predict], gpu_count=1, gpu=GpuRequest(count=1)),
    ])


def _built(declared: Manifest | None = None) -> Manifest:
    """What an honest node returns: each image locked, the manifest read with the image's Python."""
    declared = declared or _declared()
    services = [msgspec.structs.replace(s, image=_locked(s.image) if s.image else None) for s in declared.services]
    return msgspec.structs.replace(declared, services=services, python="3.11")


def _service(manifest: Manifest, i: int, **changes: Any) -> Manifest:
    services = list(manifest.services)
    services[i] = msgspec.structs.replace(services[i], **changes)
    return msgspec.structs.replace(manifest, services=services)


def _function(manifest: Manifest, **changes: Any) -> Manifest:
    service = manifest.services[0]
    return _service(manifest, 0, functions=[msgspec.structs.replace(service.functions[0], **changes)])


def test_an_honest_build_is_accepted() -> None:
    assert manifest_difference(_declared(), _built()) is None


@pytest.mark.parametrize("refine", [
    lambda m: msgspec.structs.replace(m, python="3.10", sdk_version="0.2.0"),
    lambda m: _function(m, input_schema={"type": "object", "properties": {"x": {"type": "integer"}}},
                        output_schema={"type": "array"}, input_mode="kwargs", params=["x", "y"],
                        tensors=TensorSignature(inputs=[TensorMeta(name="x")], outputs=[TensorMeta(name="output")])),
    lambda m: _service(m, 0, image=_locked(python="3.12")),  # the node's Python, the image naming none
], ids=["interpreter", "function types", "node python"])
def test_what_only_the_image_can_tell_may_be_refined(refine: Any) -> None:
    assert manifest_difference(_declared(), refine(_built())) is None


@pytest.mark.parametrize(("forge", "field"), [
    (lambda m: msgspec.structs.replace(m, app="victim"), "$.app"),
    (lambda m: msgspec.structs.replace(m, module="other"), "$.module"),
    (lambda m: msgspec.structs.replace(m, calls=["helper", "victim"]), "$.calls"),
    (lambda m: msgspec.structs.replace(m, services=m.services[:1]), "$.services"),
    (lambda m: msgspec.structs.replace(m, services=m.services[::-1]), "$.services[0].name"),
    (lambda m: _service(m, 0, name="renamed"), "$.services[0].name"),
    (lambda m: _service(m, 0, secrets=["probe-db", "team-b-db"]), "$.services[0].secrets"),
    (lambda m: _service(m, 0, volumes=[VolumeMount(path="/weights", name="team-b-weights")]),
     "$.services[0].volumes[0].name"),
    (lambda m: _service(m, 0, min_replicas=50), "$.services[0].min_replicas"),
    (lambda m: _service(m, 0, max_replicas=1000), "$.services[0].max_replicas"),
    (lambda m: _service(m, 0, block_network=True), "$.services[0].block_network"),
    (lambda m: _service(m, 1, gpu_count=8, gpu=GpuRequest(count=8)), "$.services[1].gpu_count"),
    (lambda m: _service(m, 1, gpu=GpuRequest(count=1, memory_mb=10)), "$.services[1].gpu.memory_mb"),
    (lambda m: _service(m, 1, functions=[*m.services[1].functions, m.services[1].functions[0]]),
     "$.services[1].functions"),
    (lambda m: _function(m, name="other"), "$.services[0].functions[0].name"),
    (lambda m: _function(m, attr="exfiltrate"), "$.services[0].functions[0].attr"),
    (lambda m: _function(m, on=["events.victim.in"]), "$.services[0].functions[0].on"),
    (lambda m: _function(m, result_subject="events.victim.out"), "$.services[0].functions[0].result_subject"),
    (lambda m: _function(m, public=True), "$.services[0].functions[0].public"),
    (lambda m: _function(m, batch=Batch(max_size=2)), "$.services[0].functions[0].batch"),
], ids=lambda v: v if isinstance(v, str) else "")
def test_any_other_difference_names_the_field(forge: Any, field: str) -> None:
    assert manifest_difference(_declared(), forge(_built())) == field


def _theirs_image(image: ImageSpec) -> Manifest:
    return _service(_built(), 0, image=image)


@pytest.mark.parametrize(("image", "field"), [
    (None, "$.services[0].image"),
    (IMAGE, "$.services[0].image.lock"),  # returned unlocked
    (_locked(msgspec.structs.replace(IMAGE, packages=["emberprobe==1.0", "evil"])), "$.services[0].image.packages"),
    (_locked(msgspec.structs.replace(IMAGE, find_links=["/srv/other"])), "$.services[0].image.find_links"),
    (_locked(msgspec.structs.replace(IMAGE, index_url="https://evil.example/simple")), "$.services[0].image.index_url"),
    (_locked(msgspec.structs.replace(IMAGE, env={"GREETING": "hi", "OTHER": "1"})), "$.services[0].image.env"),
    (msgspec.structs.replace(_locked(), sha256="0" * 64), "$.services[0].image.sha256"),  # another environment
    (_locked(lock="evil==6.6 \\\n    --hash=sha256:" + "b" * 64 + "\n"), "$.services[0].image.lock"),  # not pinned
], ids=["dropped", "unlocked", "packages", "find_links", "index_url", "env", "hash", "lock"])
def test_an_image_is_only_locked(image: ImageSpec | None, field: str) -> None:
    assert manifest_difference(_declared(), _theirs_image(image)) == field  # type: ignore[arg-type]


def test_an_image_added_where_none_was_declared_is_refused() -> None:
    assert manifest_difference(_declared(), _service(_built(), 1, image=_locked())) == "$.services[1].image"


def test_the_declared_manifest_is_required_the_apps_and_unlocked() -> None:
    check_declared(_declared(), "probe", "probe_app")
    for declared, app, module, field in [
        (None, "probe", "probe_app", "$.declared"),
        (_declared(), "victim", "probe_app", "$.declared.app"),
        (_declared(), "probe", "other", "$.declared.module"),
        (_built(), "probe", "probe_app", "$.declared.services[0].image.lock"),
        (_service(_declared(), 0, min_replicas=-1), "probe", "probe_app", "$.declared.services[0].min_replicas"),
    ]:
        with pytest.raises(InvalidInputError) as caught:
            check_declared(declared, app, module)
        assert caught.value.field == field, (declared, caught.value)
