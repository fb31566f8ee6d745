"""Which strings can name a call: every id Ember makes, and nothing NATS would take as a wildcard or refuse."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from nats.js.kv import _is_key_valid

from ember._errors import BadRequestError
from ember.wire import subjects
from ember_platform.calls.durable import MAX_CALL_ID, _call_id, check_call_id


@pytest.mark.parametrize("call_id", [
    uuid.uuid4().hex,
    _call_id("hello", "greet", "my-key"),
    _call_id("digits", "Classifier.predict", "\xe9t\xe9 *>"),
    hashlib.sha256(b"x").hexdigest(),
    f"{subjects.events_stream('hello', 'Classifier.predict').lower()}-17",  # an event without a Nats-Msg-Id
    "order-42", "a.b", "a/b", "a=b", "A_Z", "x" * MAX_CALL_ID,
])
def test_every_id_ember_makes_is_accepted_and_is_a_valid_key(call_id):
    assert check_call_id(call_id) == call_id
    assert _is_key_valid(f"s.{call_id}") and _is_key_valid(f"r.{call_id}")


@pytest.mark.parametrize("call_id", ["", "*", ">", "x.>", "a.*", "a b", ".", "..", ".a", "a.", "a..b", "\x00",
                                     "a\nb", "\xe9", "\u2603", "a:b", "a%3Eb", "x" * (MAX_CALL_ID + 1)])
def test_a_malformed_id_is_a_400_naming_the_field(call_id):
    with pytest.raises(BadRequestError) as caught:
        check_call_id(call_id)
    assert caught.value.field == "call_id"
    assert len(str(caught.value)) < 300  # an overlong id is not echoed whole
