"""Running a batch so that one bad input fails only its own call.

Runs on the executor thread. A batch that raises is split in halves and each half retried, down to the
single inputs at fault; an out-of-memory failure is split the same way, and the largest size that ran is
remembered so that later batches stay under it.

An ``EmberError`` a run ends with is the function's own, raised by its code or let out of a call it made: it is
named so (``remote_type``, its class, unless it has one), which tells its callers that the call ran (a router sends
again only an ``unavailable`` without one: a replica's refusal before any run; a queue worker fails an error with one
under the function's retries). Two kinds are left unnamed, the platform's: a cancel (the call was cancelled, and
the function, told so by ``current_call().cancelled``, stopped) and ``RunExpired``, a deadline the replica itself
found passed inside a run (a stream's).

Whatever the function raises is its input's error, ``SystemExit`` and ``KeyboardInterrupt`` too (code that calls
``sys.exit``): let out, they would end the replica's event loop and leave every other call unanswered. Only an
``async def`` run's own cancel (``asyncio.CancelledError``) and close (``GeneratorExit``) pass through.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ember._errors import CallCancelledError, DeadlineExceededError, EmberError, RemoteError
from ember.backends import is_out_of_memory

log = logging.getLogger("ember.batcher")


class RunExpired(DeadlineExceededError):
    """The call's deadline passed while it ran, found by the replica (a stream's next item): the platform's
    ``deadline_exceeded``, never named as the function's error."""


@dataclass
class Outcome:
    ok: bool
    value: Any = None
    error: EmberError | None = None


@dataclass
class BatchReport:
    outcomes: list[Outcome]
    clean: bool  # ran as one batch, first time: its timing is a fair cost sample
    oom_limit: int | None = None  # the largest size known to fit, after an out-of-memory split


class BatchRunner:
    """Calls ``run(values) -> outputs`` and isolates failures."""

    def __init__(self, run: Callable[[list[Any]], Any], name: str) -> None:
        self._run = run
        self._name = name

    def __call__(self, values: list[Any]) -> BatchReport:
        report = BatchReport(outcomes=[], clean=True)
        report.outcomes = self._isolate(values, report)
        return report

    def _isolate(self, values: list[Any], report: BatchReport) -> list[Outcome]:
        try:
            outputs = self._run(values)
        except BaseException as exc:  # on the executor's thread: nothing of the loop's to let through
            failed = self._failed(exc, values, report)
            if failed is not None:
                return failed
            mid = len(values) // 2
            return self._isolate(values[:mid], report) + self._isolate(values[mid:], report)
        return _outcomes(outputs, values, report)

    async def arun(self, values: list[Any]) -> BatchReport:
        """The same for an ``async def`` function (``run`` returns a coroutine), on the event loop."""
        report = BatchReport(outcomes=[], clean=True)
        report.outcomes = await self._aisolate(values, report)
        return report

    async def _aisolate(self, values: list[Any], report: BatchReport) -> list[Outcome]:
        try:
            outputs = await self._run(values)
        except (asyncio.CancelledError, GeneratorExit):  # the run's own cancel or close: the batcher's to handle
            raise
        except BaseException as exc:
            failed = self._failed(exc, values, report)
            if failed is not None:
                return failed
            mid = len(values) // 2
            return await self._aisolate(values[:mid], report) + await self._aisolate(values[mid:], report)
        return _outcomes(outputs, values, report)

    def _failed(self, exc: BaseException, values: list[Any], report: BatchReport) -> list[Outcome] | None:
        """The outcomes of a failed run, or None when the batch is to be split and each half run again."""
        report.clean = False
        if isinstance(exc, EmberError):
            return [Outcome(False, error=_named(exc)) for _ in values]
        oom = is_out_of_memory(exc)
        if len(values) == 1:
            log.error("%s: input failed: %s: %s", self._name, type(exc).__name__, exc, exc_info=not oom)
            return [Outcome(False, error=_remote(exc))]
        if oom:
            half = len(values) // 2
            report.oom_limit = min(report.oom_limit or half, half)
        return None


def _outcomes(outputs: Any, values: list[Any], report: BatchReport) -> list[Outcome]:
    if not isinstance(outputs, list | tuple) or len(outputs) != len(values):
        got = len(outputs) if isinstance(outputs, list | tuple) else type(outputs).__name__
        error = RemoteError(f"the batched function returned {got} outputs for {len(values)} inputs; "
                            "return a list with one output per input", remote_type="BatchSizeMismatch")
        report.clean = False
        return [Outcome(False, error=error) for _ in values]
    return [Outcome(True, value=v) for v in outputs]


def _named(error: EmberError) -> EmberError:
    """``error``, which a run ended with, named as the function's (see the module's docstring)."""
    if not error.remote_type and error.code != CallCancelledError.code and not isinstance(error, RunExpired):
        error.remote_type = type(error).__name__
    return error


def _remote(exc: BaseException) -> RemoteError:
    return RemoteError(str(exc) or type(exc).__name__, remote_type=type(exc).__name__)
