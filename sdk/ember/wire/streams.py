"""Streamed calls on the wire: the items of a generator function, replica to gateway, with flow control.

A streamed call goes out as a one-call frame of ``Invocation``s, like a synchronous one, whose reply subject is
the gateway's stream inbox for that call (``<stream inbox>.<app>.<token>``). The replica answers with
``StreamChunk``s on it, in order:

1. at once, an accept (``seq`` 0, no items, ``replica`` naming itself): the gateway now knows whom to send
   credit and cancellation to, and stops resending the call;
2. items, numbered from 0 by ``seq`` (the first item's number in the chunk); never past the credit the gateway
   granted, ``STREAM_WINDOW`` items at first, then up to each ``StreamCredit``'s ``upto`` on
   ``ember.replica.<id>.credit`` as the gateway's client reads them: a slow reader holds up the generator, never
   the replica's memory;
3. last, ``end`` (the generator finished) or ``error`` (it raised, or its deadline passed).

A caller that goes away is announced on ``ember.replica.<id>.cancel`` as for a synchronous call: the replica
closes the generator (its ``finally`` runs) and sends nothing more.

A caller whose ``Invocation`` says ``bundles`` also takes its stream's chunks in a ``StreamBundle`` on
``<stream inbox>.<app>.bundle`` (``subjects.stream_bundle``): the chunks that a replica has for several of one
gateway's streams at once (a Continuous step's pieces) travel in one message, each with its stream's reply token;
the gateway hands each to its stream as if it had come alone (a token of another app's stream is dropped). Each
stream's chunks stay in order: a replica sends its messages in order, on one connection.
"""

from __future__ import annotations

import msgspec

from ember.wire.calls import ErrorInfo

STREAM_WINDOW = 32  # items a replica may send at first; then as many as the gateway's credits say


class StreamChunk(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Replica to gateway: items of one streamed call (raw JSON each), or its accept, end or error."""

    call_id: str
    seq: int = 0  # the number of ``items[0]`` in the call's stream (items are numbered from 0)
    items: list[msgspec.Raw] = []
    replica: str = ""  # set on the accept: the replica that holds the call
    end: bool = False
    error: ErrorInfo | None = None
    accepted: int = 0  # on the accept: the replica's count of the streams it accepted, this one the last (see
    #                    ``LoadReport.accepted``); 0 from a replica that does not count them


class StreamCredit(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Gateway to replica: the stream ``call_id`` may send items numbered below ``upto``."""

    call_id: str
    upto: int


class StreamBundle(msgspec.Struct, frozen=True, kw_only=True, array_like=True):
    """Replica to gateway: the ``StreamChunk``s (raw JSON each) of several streams of one app, ``chunks[i]`` for the
    stream whose reply token is ``tokens[i]``."""

    tokens: list[str]
    chunks: list[msgspec.Raw]


chunk_decoder = msgspec.json.Decoder(StreamChunk)
bundle_decoder = msgspec.json.Decoder(StreamBundle)
credit_decoder = msgspec.json.Decoder(StreamCredit)


class StreamLine(msgspec.Struct, frozen=True, kw_only=True):
    """One line of a streamed call's NDJSON answer over HTTP: an item, the end, or the error it ended with."""

    item: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    end: bool = False
    items: int = 0  # with ``end``: how many items the stream had
    error: ErrorInfo | None = None


line_decoder = msgspec.json.Decoder(StreamLine)
