"""Which call a queued or event message stands for, and which headers make it fail at once."""

from __future__ import annotations

import datetime
import math

import pytest
from nats.js.kv import _is_key_valid

from ember.wire import subjects
from ember_runtime.replica.event_headers import (
    CALL_ID,
    MAX_CALL_ID,
    Delivery,
    default_event_id,
    event_delivery,
    event_scope,
    microseconds,
    queued_delivery,
    reply_subject,
)

SCOPE = event_scope(subjects.events_stream("shop", "Orders.place"))
DEFAULT = default_event_id(SCOPE, 1_700_000_000_123_456, 7)


def test_a_valid_msg_id_names_the_event_within_its_function():
    delivery = event_delivery({"Nats-Msg-Id": "order-42_b"}, SCOPE, DEFAULT, app="shop")
    assert delivery.call_id == f"ev-{SCOPE}-order-42_b" and delivery.problem is None
    assert delivery.deadline == math.inf
    other = event_scope(subjects.events_stream("shop", "Orders.refund"))
    assert event_delivery({"Nats-Msg-Id": "order-42_b"}, other, DEFAULT, app="shop").call_id != delivery.call_id


def test_an_event_cannot_name_a_call_with_ember_call_id():
    spawned = "0123456789abcdef0123456789abcdef"
    assert event_delivery({"Ember-Call-Id": spawned}, SCOPE, DEFAULT, app="shop").call_id == DEFAULT
    assert event_delivery({"Ember-Call-Id": spawned, "Nats-Msg-Id": spawned}, SCOPE, DEFAULT, app="shop").call_id == (
        f"ev-{SCOPE}-{spawned}")
    assert event_delivery({"Ember-Call-Id": "a b"}, SCOPE, DEFAULT, app="shop").problem is None  # ignored, not judged


def test_event_ids_are_never_spawned_ids_nor_each_other():
    # Spawned ids are hexadecimal; event ids start with "ev-" or "evs-", and a named one can't be a default one.
    assert "-" not in "0123456789abcdef"
    named = event_delivery({"Nats-Msg-Id": f"{SCOPE}-1700000000123456-7"}, SCOPE, DEFAULT, app="shop").call_id
    assert named != DEFAULT and named.startswith("ev-") and DEFAULT.startswith("evs-")


def test_default_ids_differ_across_stream_incarnations_and_not_across_redeliveries():
    stored = datetime.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=datetime.UTC)
    again = datetime.datetime.fromtimestamp(int(stored.timestamp() * 1e9) / 1e9, datetime.UTC)
    assert microseconds(stored) == microseconds(again) == 1714564800123456
    first = default_event_id(SCOPE, microseconds(stored), 1)
    assert first == default_event_id(SCOPE, microseconds(again), 1)  # a redelivery: the same call
    recreated = default_event_id(SCOPE, microseconds(stored + datetime.timedelta(minutes=5)), 1)
    assert recreated != first  # sequence 1 again, in a stream created anew


@pytest.mark.parametrize("value", ["", " ", "*", ">", "orders.>", "a.b", "two words", "a\nb", "\xe9", "x" * 129,
                                   "a/b", "a:b"])
def test_a_bad_msg_id_fails_the_event_under_its_default_id(value):
    delivery = event_delivery({"Nats-Msg-Id": value}, SCOPE, DEFAULT, app="shop")
    if value == "":
        assert delivery.problem is None and delivery.call_id == DEFAULT  # no id: the default one
        return
    assert delivery.call_id == DEFAULT and delivery.problem is not None
    assert delivery.problem.field == "headers.Nats-Msg-Id" and "Nats-Msg-Id" in delivery.problem.message
    assert delivery.problem.call_id == DEFAULT
    assert len(delivery.problem.message) < 300  # a long value is not echoed whole


@pytest.mark.parametrize("value", ["soon", "nan", "NaN", "inf", "-inf", "1e999", "", "12 34", "1" * 65])
def test_a_deadline_must_be_a_finite_number(value):
    delivery = event_delivery({"Ember-Deadline": value, "Nats-Msg-Id": "m1"}, SCOPE, DEFAULT, app="shop")
    assert delivery.call_id == f"ev-{SCOPE}-m1" and delivery.deadline == math.inf
    assert delivery.problem is not None and delivery.problem.field == "headers.Ember-Deadline"
    assert queued_delivery({"Ember-Deadline": value, "Ember-Call-Id": "abc"}, "d").problem is not None


@pytest.mark.parametrize("value", ["1714564800.5", " 1714564800 ", "-1", "0", repr(1714564800.123456789)])
def test_a_finite_deadline_is_used(value):
    assert event_delivery({"Ember-Deadline": value}, SCOPE, DEFAULT, app="shop").deadline == float(value)


@pytest.mark.parametrize("value", ["tagger.>", "a.*", "a..b", ".a", "a.", "two words", "$JS.API.STREAM.LIST",
                                   "$SYS.x", "ember.calls.default.app.fn", "_EMBER.x", "a\rb", "x" * 257])
def test_a_bad_reply_subject_fails_the_event(value):
    headers = {"Ember-Reply-To": value}
    delivery = event_delivery(headers, SCOPE, DEFAULT, app="shop")
    assert delivery.problem is not None and delivery.problem.field == "headers.Ember-Reply-To"
    assert reply_subject(headers, "shop") is None  # its failure goes to the function's result subject


@pytest.mark.parametrize("value", ["_EMBER.replies.shop.abc123", "_EMBER.replies.shop.abc.def"])
def test_a_reply_subject_of_the_app_is_used(value):
    assert reply_subject({"Ember-Reply-To": value}, "shop") == value
    assert event_delivery({"Ember-Reply-To": value}, SCOPE, DEFAULT, app="shop").problem is None


def test_the_functions_own_result_subject_is_used():
    assert reply_subject({"Ember-Reply-To": "results.mine"}, "shop", "results.mine") == "results.mine"
    delivery = event_delivery({"Ember-Reply-To": "results.mine"}, SCOPE, DEFAULT, "results.mine", app="shop")
    assert delivery.problem is None


@pytest.mark.parametrize("value", ["results", "results.mine", "emberish.x", "a-b_c.D9", "_INBOX", "_INBOX.abc123",
                                   "_EMBER.replies.shop", "_EMBER.replies.other.abc", "_EMBER.replies.shopx.abc"])
def test_any_other_subject_fails_the_event(value):
    # A replica's NATS permissions allow results only to its app's reply subjects and its function's result subject
    # (never another client's inbox, nor another app's replies): anywhere else
    # is refused here, with the reason, rather than lost to a permissions violation.
    delivery = event_delivery({"Ember-Reply-To": value}, SCOPE, DEFAULT, "results.ours", app="shop")
    assert delivery.problem is not None and "nowhere else" in str(delivery.problem)
    assert reply_subject({"Ember-Reply-To": value}, "shop", "results.ours") is None


def test_queued_calls_keep_the_id_the_platform_set():
    spawned = {"Ember-Call-Id": "abc123", "Nats-Msg-Id": "abc123", "Ember-Deadline": "5.5"}
    assert queued_delivery(spawned, "ember_calls-3") == Delivery("abc123", 5.5, None)
    assert queued_delivery({"Nats-Msg-Id": "k1"}, "ember_calls-3").call_id == "k1"
    assert queued_delivery({}, "ember_calls-3").call_id == "ember_calls-3"
    bad = queued_delivery({"Ember-Call-Id": "a.>"}, "ember_calls-3")
    assert bad.call_id == "ember_calls-3" and bad.problem is not None and bad.problem.field == "headers.Ember-Call-Id"


@pytest.mark.parametrize("call_id", [DEFAULT, f"ev-{SCOPE}-{'x' * MAX_CALL_ID}", "ember_calls-3"])
def test_every_id_made_here_is_a_key_token(call_id):
    assert _is_key_valid(f"s.{call_id}") and _is_key_valid(f"r.{call_id}") and "." not in call_id
    assert CALL_ID.pattern.startswith("[A-Za-z0-9_-]")
