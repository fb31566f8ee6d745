"""Which model names an app holds: those its running versions serve; a version that drops one keeps it held until
it takes all of the app's traffic."""

from __future__ import annotations

import msgspec
from support.builders import service_spec

from ember.wire import Deployment, DeployRequest, FunctionSpec, Manifest
from ember_platform.control import rollout
from ember_platform.control.models import named, served


def _push(current: Deployment | None, models: list[str], now: float) -> Deployment:
    """Version after ``current`` of app "a": one service, a plain function then a model of each of ``models``."""
    svc = service_spec("s")
    fns = [FunctionSpec(name=f"f{i}", attr=f"f{i}", input_mode="none", stream=True, openai=m)
           for i, m in enumerate(models)]
    manifest = Manifest(app="a", module="m", services=[msgspec.structs.replace(svc, functions=[*svc.functions, *fns])])
    return rollout.record_push(current, "a", DeployRequest(bundle_sha256="x", manifest=manifest), now)


def test_the_names_of_the_running_versions_each_with_the_field_that_names_it():
    v1 = _push(None, ["llama", "mistral"], 1.0)
    assert served(v1) == {"llama": "$.manifest.services[0].functions[1].openai",
                          "mistral": "$.manifest.services[0].functions[2].openai"}
    v2 = _push(v1, ["llama"], 2.0)  # rolling out: v1 still takes the calls, and serves mistral
    assert served(v2) == {"llama": "$.manifest.services[0].functions[1].openai", "mistral": "$.version"}
    switched = rollout.switch(v2, True, 3.0)
    assert switched is not None and served(switched) == {"llama": "$.manifest.services[0].functions[1].openai"}
    assert served(None) == {} and named(v1.manifest, "$.x") == {"llama": "$.x", "mistral": "$.x"}
