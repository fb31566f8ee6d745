"""Which strings can name a call: every id Ember makes, and nothing NATS would take as a wildcard or refuse."""

from __future__ import annotations

import hashlib
import os
import uuid

import pytest
from nats.js.kv import _is_key_valid

from ember._errors import BadRequestError
from ember.wire import subjects
from ember.wire.callstore import new_call_id
from ember_platform.calls.durable import MAX_CALL_ID, _key_hash, check_call_id


@pytest.mark.parametrize("call_id", [
    # random ids under fixed names: every pytest-xdist worker collects the same tests
    pytest.param(new_call_id("hello"), id="new_call_id"),
    pytest.param(uuid.uuid4().hex, id="uuid4"),
    pytest.param(os.urandom(16).hex(), id="random-hex"),
    f"k.{_key_hash('digits', 'é *> any key')}"[2:],  # where a key's mapping is kept is a valid key too
    hashlib.sha256(b"x").hexdigest(),
    f"{subjects.events_stream('hello', 'Classifier.predict').lower()}-17",  # an event without a Nats-Msg-Id
    "order-42", "a.b", "a/b", "a=b", "A_Z", "x" * MAX_CALL_ID,
])
def test_every_id_ember_makes_is_accepted_and_is_a_valid_key(call_id):
    assert check_call_id(call_id) == call_id
    assert all(_is_key_valid(subjects.call_key(kind, "app", call_id)) for kind in "sr")


@pytest.mark.parametrize("call_id", ["", "*", ">", "x.>", "a.*", "a b", ".", "..", ".a", "a.", "a..b", "\x00",
                                     "a\nb", "\xe9", "\u2603", "a:b", "a%3Eb", "x" * (MAX_CALL_ID + 1)])
def test_a_malformed_id_is_a_400_naming_the_field(call_id):
    with pytest.raises(BadRequestError) as caught:
        check_call_id(call_id)
    assert caught.value.field == "call_id"
    assert len(str(caught.value)) < 300  # an overlong id is not echoed whole


def test_an_idempotency_key_is_kept_under_a_digest_per_app():
    assert _key_hash("a", "k") != _key_hash("b", "k")  # per app
    assert _key_hash("a", "k") == _key_hash("a", "k") and len(_key_hash("a", "k")) == 64
    assert _is_key_valid(subjects.call_key("k", "a", _key_hash("a", "x.* >")))
