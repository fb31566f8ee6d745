"""An output holding an infinity or a NaN fails its call, naming the field: JSON has neither, and msgspec wrote
``null`` in its place, so a batched sum that overflowed answered ``200 {"total": null}`` where its schema says
number (schemathesis' ST108). A None the function returns is still null; msgpack keeps them as they are."""

from __future__ import annotations

import dataclasses
import math

import msgspec
import numpy as np
import pytest

import ember
from ember.wire.codec import encode_output


class Total(msgspec.Struct):
    total: float
    parts: list[float]


@dataclasses.dataclass
class Pair:
    a: float
    b: float | None


@pytest.mark.parametrize(("output", "where"), [
    (math.inf, "$ is inf"),
    ({"total": math.inf}, "$.total is inf"),
    ({"rows": [[1.0, 2.0], [3.0, math.nan]]}, "$.rows[1][1] is nan"),
    (Total(total=1.0, parts=[0.5, -math.inf]), "$.parts[1] is -inf"),
    (Pair(a=math.nan, b=None), "$.a is nan"),
    (np.array([1.0, np.inf], dtype=np.float32), "$[1] is inf"),
    ((1, {"x": np.float64("inf")}), "$[1].x is inf"),
])
def test_an_output_with_an_infinity_or_a_nan_fails_naming_the_field(output, where):
    with pytest.raises(ember.RemoteError) as failed:
        encode_output(output)
    assert failed.value.remote_type == "InvalidOutput"
    assert f"the output is not JSON: {where} " in str(failed.value)


def test_a_torch_tensor_is_read_as_a_list():
    import torch  # here: not imported by every worker that collects this file
    with pytest.raises(ember.RemoteError, match=r"\$\.scores\[1\] is nan"):
        encode_output({"scores": torch.tensor([0.0, float("nan")])})


@pytest.mark.parametrize(("output", "encoded"), [
    ({"total": None}, b'{"total":null}'),
    (Pair(a=1.5, b=None), b'{"a":1.5,"b":null}'),
    ([1.0, None, 2.5], b"[1.0,null,2.5]"),
    ("null", b'"null"'),
    (1e308, b"1e308"),
])
def test_a_none_is_still_null_and_finite_numbers_pass(output, encoded):
    assert encode_output(output) == encoded


def test_msgpack_keeps_non_finite_floats():
    assert msgspec.msgpack.decode(encode_output({"total": math.inf}, "msgpack")) == {"total": math.inf}
