"""Queued calls that will not run, because what would run them is gone: an app deleted, a version no longer kept, a
function that no version taking calls has any more (``ember_platform.control.queues`` decides which).

Each message waiting on the queue's subject is read by a direct get of the next one (no consumer is made), its call
finished as ``cancelled`` with the reason (first writer wins: a replica that finishes it at the same moment keeps its
result), and that message deleted, one by one. A call queued while the subject is walked is found by the same walk
(its sequence is higher), and no message is removed without its record saying why: a purge of the subject would
also drop the messages stored after the walk, their records left "queued" until they expire.

Everything here can run twice, or on two control planes at once: a record already final is left as it is, and a
message or consumer already deleted is no error."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable
from typing import Any, NamedTuple

from nats.js.errors import APIError as JsAPIError
from nats.js.errors import NotFoundError as JsNotFound

from ember.wire import CALL_ID_HEADER, FINAL_STATUSES, CallRecord, ErrorInfo, subjects
from ember.wire.callstore import CallStore, final

log = logging.getLogger("ember.retire")

# A call id is a key of the calls' KV bucket after ``s.<app>.``/``r.<app>.``: the characters NATS allows in a key, in
# tokens that are never empty (no leading, trailing or doubled '.'), and no wildcard. The ids that exist: a spawned
# call's ``<app>_<random hex>`` (with or without an Idempotency-Key), a synchronous call's 16 random bytes, and an
# event's ``ev-<scope>-<Nats-Msg-Id>`` or ``evs-<scope>-<stored at>-<sequence>`` (``ember.wire.callstore.app_of``).
CALL_ID = re.compile(r"[-/_=A-Za-z0-9]+(?:\.[-/_=A-Za-z0-9]+)*")
MAX_CALL_ID = 512
NO_SUCH_SEQUENCE = (10043, 10057)  # JetStream's errors deleting a message that is gone (or going, concurrently)
Spare = Callable[[CallRecord], bool]  # a call left where it is, with its message (one still running, say)


def is_call_id(call_id: str) -> bool:
    """Whether ``call_id`` can name a call (and so be read from the calls' bucket as a key)."""
    return len(call_id) <= MAX_CALL_ID and CALL_ID.fullmatch(call_id) is not None


def app_queues(app: str) -> str:
    """The subject of every queue of ``app`` (``ember.calls.<tenant>.<app>.>``): its functions' own queues and those
    pinned to their versions; no other app's (the app is one whole token)."""
    return f"{subjects.calls(app, 'f').rpartition('.')[0]}.>"


def own_queue_function(app: str, subject: str) -> str | None:
    """The function whose own queue ``subject`` is (``subjects.calls``), if it is one of ``app``'s; else None."""
    prefix = app_queues(app)[:-1]
    token = subject[len(prefix):] if subject.startswith(prefix) else ""
    return token.replace("-", ".") if token and "." not in token else None


class Walked(NamedTuple):
    """What ``cancel_waiting`` did: calls it cancelled, and calls it left (``spare``)."""

    cancelled: int = 0
    spared: int = 0


async def cancel_waiting(js: Any, store: CallStore, app: str, subject: str, reason: str,
                         spare: Spare | None = None) -> Walked:
    """Finish as ``cancelled`` (its error saying ``reason``) each call of ``app`` whose message waits on ``subject``
    (wildcards allowed) of the calls' stream, and delete that message; a message whose call is final already, or
    unknown (expired), is deleted too. A call that ``spare`` keeps is left with its message. Only the messages
    stored when the walk began: one spawned later came after the decision (another control plane's rollback may
    have brought the function back meanwhile; a stray is caught by the next pass)."""
    seq, cancelled, spared = 1, 0, 0
    last = (await js.stream_info(subjects.CALLS_STREAM)).state.last_seq
    while True:
        try:
            msg = await js.get_msg(subjects.CALLS_STREAM, seq=seq, subject=subject, next=True)
        except JsNotFound:
            return Walked(cancelled, spared)
        if (msg.seq or seq) > last:
            return Walked(cancelled, spared)
        seq = (msg.seq or seq) + 1
        call_id = (msg.headers or {}).get(CALL_ID_HEADER)
        try:
            record = await store.status(app, call_id) if call_id and is_call_id(call_id) else None
            if record is not None and record.status not in FINAL_STATUSES:
                if spare is not None and spare(record):
                    spared += 1
                    continue
                cancelled += await _cancel(store, record, reason)
            await delete_message(js, seq - 1)
        except Exception as exc:  # this one call's store could not answer now: the walk goes on to the others
            log.warning("could not cancel the call waiting at %d of %s: %r", seq - 1, subject, exc)
            spared += 1


async def _cancel(store: CallStore, record: CallRecord, reason: str) -> bool:
    """Whether this cancel finished the call (not a replica, nor another control plane, first)."""
    cancelled = final(record, "cancelled", error=ErrorInfo(code="cancelled", message=reason, call_id=record.call_id))
    if not await store.finish(cancelled):
        return False
    await store.set_status(cancelled)
    return True


async def delete_message(js: Any, seq: int) -> None:
    """Delete one message of the calls' stream; one already gone is no error."""
    try:
        await js.delete_msg(subjects.CALLS_STREAM, seq)
    except JsAPIError as exc:
        if exc.err_code not in NO_SUCH_SEQUENCE:
            raise


async def delete_consumer(js: Any, stream: str, name: str) -> None:
    """Delete a consumer; one already gone is no error."""
    with contextlib.suppress(JsNotFound):
        await js.delete_consumer(stream, name)


async def consumers_of(js: Any, app: str) -> list[str]:
    """The names of the calls' stream's consumers that take ``app``'s calls (whose filter is one of its queues)."""
    prefix = app_queues(app)[:-1]
    names: list[str] = []
    offset = 0
    while page := await js.consumers_info(subjects.CALLS_STREAM, offset=offset):  # 256 at most per page
        offset += len(page)
        names += [c.name for c in page if c.name and (c.config.filter_subject or "").startswith(prefix)]
    return names


async def waiting_functions(js: Any, app: str) -> set[str]:
    """The functions of ``app`` whose own queue holds a message (one stream info, filtered on them)."""
    info = await js.stream_info(subjects.CALLS_STREAM, subjects_filter=app_queues(app)[:-1] + "*")
    found = (own_queue_function(app, subject) for subject in (info.state.subjects or {}))
    return {name for name in found if name is not None}
