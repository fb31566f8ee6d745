"""Whose an error a run ends with is: ``BatchRunner`` names an ``EmberError`` the function raised by its class
(``remote_type``), so that a router does not send it again and a queue worker fails it under its retries; a cancel
and the replica's own ``RunExpired`` stay the platform's."""

from __future__ import annotations

import math
import time

import pytest

import ember
from ember._errors import EmberError
from ember_runtime.batching.isolation import BatchRunner, RunExpired
from ember_runtime.replica.queue_worker import _outcome, _refused


def _ended_with(error: EmberError) -> EmberError | None:
    def run(values: list[int]) -> list[int]:
        raise error

    (outcome,) = BatchRunner(run, "f")([1]).outcomes
    return outcome.error


@pytest.mark.parametrize("error", [ember.UnavailableError("a dependency is down", retry_after_s=2.0),
                                   ember.DeadlineExceededError("no answer from the control plane within 1s"),
                                   ember.OverloadedError("busy"), ember.InvalidInputError("bad", field="$.x")])
def test_an_error_the_function_raises_is_named_its_own(error):
    ended = _ended_with(error)
    assert ended is error and ended.remote_type == type(error).__name__
    assert not _refused(ended, 1) and not _refused(ended, 0)  # it ran: never sent back unspent
    assert _outcome(ended, math.inf) == ("failed", ended)  # under the function's retries: it ran and failed


def test_a_type_it_came_with_is_kept():
    inner = ember.DeadlineExceededError("inner", remote_type="CallCycleError")
    assert _ended_with(inner).remote_type == "CallCycleError"


def test_a_deadline_raised_in_the_run_expires_the_call_once_its_own_deadline_passed():
    ended = _ended_with(ember.DeadlineExceededError("no answer"))
    assert _outcome(ended, time.time() - 1)[0] == "expired"


@pytest.mark.parametrize("error", [ember.CallCancelledError("the call was cancelled"),
                                   RunExpired("the stream ran past the call's deadline")])
def test_a_cancel_and_the_replicas_own_expiry_stay_the_platforms(error):
    ended = _ended_with(error)
    assert ended is error and ended.remote_type is None
    assert _outcome(ended, math.inf)[0] == ("cancelled" if error.code == "cancelled" else "expired")
