"""A call id names its app: the control plane reads a call under the app its id names, never under another."""

from __future__ import annotations

import pytest

from ember.wire import subjects
from ember.wire.callstore import app_of, new_call_id

SCOPES = {subjects.event_scope(subjects.events_stream("shop", "Orders.place")): "shop"}


def test_a_spawned_calls_id_names_its_app():
    call_id = new_call_id("team-b-app")
    assert call_id.startswith("team-b-app_") and len(call_id) == len("team-b-app_") + 32
    assert app_of(call_id, SCOPES.get) == "team-b-app"
    assert new_call_id("team-b-app") != call_id


def test_an_events_id_names_its_app_through_its_functions_scope():
    scope = next(iter(SCOPES))
    assert app_of(f"ev-{scope}-order-42", SCOPES.get) == "shop"
    assert app_of(f"evs-{scope}-1700000000123456-7", SCOPES.get) == "shop"
    assert app_of(f"ev-{'0' * 12}-order-42", SCOPES.get) is None  # no deployed function has that scope


@pytest.mark.parametrize("call_id", ["", "0123456789abcdef0123456789abcdef", "shop_", "shop_xyz", "Shop_" + "a" * 32,
                                     "shop." + "a" * 32, "a" * 64 + "_" + "b" * 32, "shop_" + "a" * 33])
def test_an_id_of_neither_form_names_no_app(call_id):
    assert app_of(call_id, SCOPES.get) is None


def test_an_app_name_that_is_not_one_subject_token_gets_no_id():
    with pytest.raises(ValueError):
        new_call_id("a.b")
