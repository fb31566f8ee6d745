"""Headers Ember reads or writes: on NATS messages of queued and event calls, and on HTTP requests and answers."""

import re

# NATS headers of a queued call (synchronous calls travel in frames: see ``calls.Invocation``). Queued and
# event calls are batch-class in the replica's batcher; synchronous calls are interactive.
CALL_ID_HEADER = "Ember-Call-Id"
DEADLINE_HEADER = "Ember-Deadline"  # absolute, seconds since the epoch
# On a control plane's cancel of a running call (``subjects.replica_cancel``): "1" to stop and replace the replica.
TERMINATE_HEADER = "Ember-Terminate"
# What a queued call's status record said when it was queued (its ``created_at``, and the sha256 of a body submitted
# with an Idempotency-Key): the replica that takes it first writes its running status from them, with no read.
CREATED_AT_HEADER = "Ember-Created-At"
INPUT_SHA256_HEADER = "Ember-Input-Sha256"
# On a call's final record in ``ember_calls`` (``r.<app>.<id>``): when its run started (``CallRecord.started_at``), so
# that a watch of the records' headers alone (the schedule loop's) knows it without reading the record.
STARTED_AT_HEADER = "Ember-Started-At"
MSG_ID_HEADER = "Nats-Msg-Id"  # JetStream's deduplication id; an event's gives its call id
# A call id a message names (``Ember-Call-Id``, an event's ``Nats-Msg-Id``, which the ``Idempotency-Key`` of ``POST
# /v1/events/<subject>`` becomes) is one key token of ``ember_calls`` (``s.<app>.<id>``) and part of a dead letter's
# ``Nats-Msg-Id``: letters, digits, ``-`` and ``_`` only (a ``.`` would add a key level; ``:``, ``+``, a space or a
# wildcard is in no KV key). The gateway refuses any other key (422) and a replica fails such a message unrun.
MAX_MSG_CALL_ID = 128
MSG_CALL_ID = re.compile(rf"[A-Za-z0-9_-]{{1,{MAX_MSG_CALL_ID}}}")
MSG_CALL_ID_RULE = f"1 to {MAX_MSG_CALL_ID} letters, digits, '-' or '_'"

# HTTP headers.
HTTP_TIMEOUT_HEADER = "X-Ember-Timeout"  # seconds; caps the function's timeout_s
MIN_TIMEOUT_S = 0.05  # the least X-Ember-Timeout: a shorter deadline is a 400 naming the header, not a 504 after a try
HTTP_CALL_ID_HEADER = "X-Ember-Call-Id"
HTTP_BATCH_SIZE_HEADER = "X-Ember-Batch-Size"
HTTP_VERSION_HEADER = "X-Ember-Version"  # on an answer: the app version that ran the call

# Events: headers a publisher may set, and those of the result message.
EVENT_REPLY_TO_HEADER = "Ember-Reply-To"  # a requester's inbox (_INBOX.<...>): the result goes there
EVENT_STATUS_HEADER = "Ember-Status"  # on a result: "succeeded" (body: the output) or "failed" (body: ErrorInfo)
