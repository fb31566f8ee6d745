"""``gpu=`` forms parse into one ``GpuRequest``; bad ones say what is wrong."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from support.builders import service_spec

import ember
from ember_platform.scheduler import GpuRequest, parse_gpu, request_from_spec


@pytest.mark.parametrize(("gpu", "expected"), [
    (None, GpuRequest()),
    (0, GpuRequest()),
    (2, GpuRequest(count=2)),
    ("A10G", GpuRequest(count=1, types=("A10G",))),
    ("H100:2", GpuRequest(count=2, types=("H100",))),
    ("any", GpuRequest(count=1)),
    ("any:4", GpuRequest(count=4)),
    (["H100", "A100"], GpuRequest(count=1, types=("H100", "A100"))),
    (("L4",), GpuRequest(count=1, types=("L4",))),
    ("24GB", GpuRequest(count=1, memory_mb=24576)),
    ("0.5gb", GpuRequest(count=1, memory_mb=512)),
    ("L4:12GB", GpuRequest(count=1, memory_mb=12288, types=("L4",))),
    ("H100:2:40GB", GpuRequest(count=2, memory_mb=40960, types=("H100",))),
    ("1g.10gb", GpuRequest(count=1, mig_profile="1g.10gb")),
    ("A100:1g.10gb", GpuRequest(count=1, types=("A100",), mig_profile="1g.10gb")),
    ("A100:1g.10gb+me", GpuRequest(count=1, types=("A100",), mig_profile="1g.10gb+me")),
    ("H100:4:nvlink", GpuRequest(count=4, types=("H100",), topology="nvlink")),
    ({"count": 2, "memory_gb": 40, "types": ["H100", "A100"], "topology": "nvlink"},
     GpuRequest(count=2, memory_mb=40960, types=("H100", "A100"), topology="nvlink")),
    ({"memory_gb": 7.5}, GpuRequest(count=1, memory_mb=7680)),
    ({"mig": "3g.40gb", "types": ["A100"]}, GpuRequest(count=1, types=("A100",), mig_profile="3g.40gb")),
    (GpuRequest(count=3), GpuRequest(count=3)),
])
def test_gpu_forms(gpu: Any, expected: GpuRequest) -> None:
    assert parse_gpu(gpu) == expected


@pytest.mark.parametrize(("gpu", "message"), [
    (9, "count=9: a GPU count is from 0 to 8"),
    (-1, "count=-1"),
    (True, "not a GPU request"),
    (1.5, "not a GPU request"),
    ("", "'' is neither a count"),
    ("H100:2:3", "'3': a second count"),
    ("H100:A100", "'A100': a second GPU type; list several acceptable types as gpu=['H100', 'A100']"),
    ("H100:2:4GB:8GB", "'8GB': a second memory"),
    ("H100:?", "'?' is neither a count, a memory such as '24GB', a MIG profile, 'nvlink' nor a GPU type"),
    ("1g.10gb:2", "a MIG request is one slice"),
    ("H100:nvlink", "topology='nvlink' joins GPUs: count must be >= 2, got 1"),
    (["H100:2", "A100"], "list GPU types without counts"),
    (["H100", "H100"], "a type is listed twice"),
    ({"count": 2, "memory": 40}, "unknown key(s) ['memory']"),
    ({"memory_gb": 0}, "memory_gb=0: a number of GB > 0"),
    ({"memory_gb": "40"}, "memory_gb='40'"),
    ({"types": "H100"}, "types='H100': a list of GPU type names"),
    ({"count": 2, "topology": "pcie"}, "the one topology is 'nvlink'"),
    ({"count": "2"}, "count='2': a GPU count is an int"),
    ({"mig": "big"}, "mig_profile='big' is not a MIG profile"),
])
def test_bad_gpu_forms_say_what_is_wrong(gpu: Any, message: str) -> None:
    with pytest.raises(ember.InvalidSpecError) as caught:
        parse_gpu(gpu, where="@app.function")
    assert message in str(caught.value)
    assert str(caught.value).startswith(f"@app.function(gpu={gpu!r}): ")
    assert "use gpu=None" in str(caught.value)


def test_a_request_validates_itself_even_when_decoded() -> None:
    with pytest.raises(ember.InvalidSpecError, match="memory, types and topology need count >= 1"):
        GpuRequest(count=0, memory_mb=10)
    with pytest.raises(msgspec.ValidationError, match="count=12"):
        msgspec.json.decode(b'{"count": 12}', type=GpuRequest)


def test_request_properties() -> None:
    assert GpuRequest().cpu_only and GpuRequest(count=1).exclusive
    assert not GpuRequest(count=1, memory_mb=1).exclusive


def test_request_from_today_s_service_spec() -> None:
    assert request_from_spec(service_spec()) == GpuRequest()
    assert request_from_spec(service_spec(gpu_count=2, gpu_types=["H100", "A100"])) == GpuRequest(
        count=2, types=("H100", "A100"))


def test_request_from_a_decorated_function() -> None:
    app = ember.App("req")

    @app.function(gpu="H100:2")
    def embed(x: int) -> int:
        return x

    assert request_from_spec(app.services["embed"]) == GpuRequest(count=2, types=("H100",))
