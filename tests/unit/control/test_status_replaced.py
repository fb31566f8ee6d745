"""What ``ember status`` says of a replica that gave way and was replaced: when (UTC) and why, for an hour."""

from __future__ import annotations

from ember_platform.control.service_state import ServiceState
from ember_platform.control.status import REPLACED_SHOWN_S, _replaced
from ember_platform.scheduler import AutoscaleState


def test_a_replacement_is_told_for_an_hour() -> None:
    state = ServiceState(autoscale=AutoscaleState(desired=1))
    assert _replaced(state, now=1000.0) == "" and _replaced(None) == ""
    state.last_replaced = (3_600.0 * 24 + 61.0, "its health check ok() raised OSError: gone")
    at = state.last_replaced[0]
    assert _replaced(state, now=at + 5) == "a replica at 00:01:01 UTC: its health check ok() raised OSError: gone"
    assert _replaced(state, now=at + REPLACED_SHOWN_S + 1) == ""
