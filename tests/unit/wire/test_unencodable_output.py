"""An output its encoder cannot write (one that holds itself, an integer beyond msgpack's 64 bits, a ``tolist`` that
raises) is that call's error, a ``user_error`` named ``InvalidOutput``: it escaped the answer, and the batcher's loop
died with it (that call and every later one of the function on that replica went unanswered)."""

from __future__ import annotations

from typing import Any

import pytest

from ember._errors import RemoteError
from ember.wire.codec import encode_output
from ember_runtime.replica.answers import answer_of


def _holds_itself() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


class Faulty:
    """An array from a library the encoder turns into lists, whose conversion fails."""

    __module__ = "numpy"

    def tolist(self) -> list[int]:
        raise RuntimeError("the device went away")


@pytest.mark.parametrize(("output", "codec", "words"), [
    (_holds_itself(), "json", "holds itself"),
    (_holds_itself(), "msgpack", "holds itself"),
    ({"deep": _holds_itself()}, "json", "holds itself"),
    (2**70, "msgpack", "in msgpack"),
    ([-(2**70)], "msgpack", "in msgpack"),
    ([Faulty()], "json", "RuntimeError: the device went away"),  # the queue worker encodes with encode_output alone
])
def test_an_unencodable_output_is_invalid_output(output, codec, words):
    with pytest.raises(RemoteError, match=words) as caught:
        encode_output(output, codec)
    assert caught.value.remote_type == "InvalidOutput"
    answer = answer_of("c1", output, None, 1, codec)
    assert answer.error is not None and answer.error.code == "user_error" and answer.error.type == "InvalidOutput"
    assert words in answer.error.message and answer.error.call_id == "c1"


def test_a_big_integer_is_fine_in_json():
    assert encode_output(2**70) == str(2**70).encode()


def test_any_failure_to_encode_is_the_calls_error():
    answer = answer_of("c2", [Faulty()], None, 1, "json")
    assert answer.error is not None and answer.error.type == "InvalidOutput"
    assert "RuntimeError: the device went away" in answer.error.message
