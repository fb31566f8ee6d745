"""Scaling and retry options of the decorators reach the manifest, and bad values say how to fix them."""

from __future__ import annotations

import pytest

import ember


def test_scaling_options_reach_the_service_spec() -> None:
    app = ember.App("scaling")

    @app.function(min_replicas=0, max_replicas=4, buffer_replicas=1, scaledown_window_s=5, retries=2)
    def f(x: int) -> int:
        return x

    @app.model(buffer_replicas=2, scaledown_window_s=0, retries=ember.Retries(max_retries=1, initial_delay_s=0.5))
    class M:
        @ember.method()
        def g(self) -> int:
            return 1

    f_spec, m_spec = app.services["f"], app.services["M"]
    assert (f_spec.buffer_replicas, f_spec.scaledown_window_s, f_spec.retries.max_retries) == (1, 5.0, 2)
    assert (m_spec.buffer_replicas, m_spec.scaledown_window_s, m_spec.retries.initial_delay_s) == (2, 0.0, 0.5)


@pytest.mark.parametrize(("options", "message"), [
    ({"buffer_replicas": -1}, "buffer_replicas"),
    ({"buffer_replicas": True}, "buffer_replicas"),
    ({"scaledown_window_s": -5}, "scaledown_window_s"),
    ({"scaledown_window_s": "1m"}, "scaledown_window_s"),
    ({"retries": -1}, "ember.Retries"),
    ({"retries": 1.5}, "ember.Retries"),
])
def test_bad_scaling_options_are_refused(options: dict, message: str) -> None:
    app = ember.App("scaling")
    with pytest.raises(ember.InvalidSpecError, match=message):
        app.function(**options)


def test_retry_delays_back_off_up_to_the_maximum() -> None:
    retries = ember.Retries(max_retries=5, initial_delay_s=1.0, backoff_coefficient=2.0, max_delay_s=5.0)
    assert [retries.delay_s(k) for k in range(1, 6)] == [1.0, 2.0, 4.0, 5.0, 5.0]
    with pytest.raises(ember.InvalidSpecError, match="backoff_coefficient"):
        ember.Retries(backoff_coefficient=0.5)


@pytest.mark.parametrize(("gpu", "expected"), [
    ("24GB", {"count": 1, "memory_mb": 24 * 1024}),
    ("1g.10gb", {"mig_profile": "1g.10gb"}),
    ("H100:4:nvlink", {"count": 4, "types": ("H100",), "topology": "nvlink"}),
    ({"count": 2, "memory_gb": 40, "types": ["H100", "A100"]}, {"count": 2, "memory_mb": 40 * 1024,
                                                                 "types": ("H100", "A100")}),
])
def test_the_full_gpu_request_reaches_the_scheduler(gpu: object, expected: dict) -> None:
    from ember_platform.scheduler import request_from_spec

    app = ember.App("gpus")

    @app.function(gpu=gpu)
    def f() -> int:
        return 1

    request = request_from_spec(app.services["f"])
    assert {key: getattr(request, key) for key in expected} == expected
    assert app.services["f"].gpu == request  # carried whole in the manifest
