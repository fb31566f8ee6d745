"""A frame of synchronous calls (``ember.wire.Invocation``) as its calls, even when its decoder cannot take it whole.

A frame's decoder recurses into each call's input, to skip it: an input nested deeper than the decoder's stack allows
fails the whole frame (``RecursionError``). The frame is then cut into its calls without recursion, each input left
as it came, so that every call of it is still answered: a call's own input fails to decode as that call's error
(``Endpoint.decode``: invalid input), and the frame's other calls run.
"""

from __future__ import annotations

import logging
import re

import msgspec

from ember.wire import Invocation, invocations_decoder, packed_invocations_decoder

log = logging.getLogger("ember.replica")
INPUT = 3  # an invocation's input: its fourth field (it is ``array_like``)
Span = tuple[int, int] | None  # where a call's input is in the frame (None: it has none)


def decode_frame(data: bytes, packed: bool, subject: str = "") -> list[Invocation] | None:
    """The calls of a frame (msgpack when ``packed``); None, logged, for one that is no list of calls (not from a
    gateway: nobody to answer)."""
    try:
        return (packed_invocations_decoder if packed else invocations_decoder).decode(data)
    except msgspec.DecodeError as exc:
        log.warning("dropped an undecodable frame on %s: %s", subject, exc)
        return None
    except RecursionError:
        pass
    try:
        return salvage(data, packed)
    except (msgspec.DecodeError, RecursionError, ValueError, IndexError, KeyError) as exc:
        log.warning("dropped an undecodable frame on %s: %s", subject, exc or type(exc).__name__)
        return None


def salvage(data: bytes, packed: bool) -> list[Invocation]:
    """The calls of a frame too deep to decode whole: its calls decoded with each input cut out (null in its place),
    then given their inputs back, undecoded."""
    spans = packed_spans(data) if packed else json_spans(data)
    null = b"\xc0" if packed else b"null"
    pieces, kept = [], 0
    for span in spans:
        if span is not None:
            pieces += [data[kept:span[0]], null]
            kept = span[1]
    pieces.append(data[kept:])
    calls = (packed_invocations_decoder if packed else invocations_decoder).decode(b"".join(pieces))
    if len(calls) != len(spans):
        raise ValueError(f"{len(calls)} calls decoded, {len(spans)} found")
    return [call if span is None else msgspec.structs.replace(call, input=msgspec.Raw(data[span[0]:span[1]]))
            for call, span in zip(calls, spans, strict=True)]


_JSON_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{},]', re.DOTALL)  # strings whole, brackets, commas
_JSON_NESTING = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]', re.DOTALL)  # inside an input: no commas to count


def json_spans(data: bytes) -> list[Span]:
    """Where each call's input is in a JSON frame (a list of arrays), found by counting brackets outside strings."""
    spans: list[Span] = []
    depth = field = start = pos = 0
    while (token := (_JSON_TOKEN if depth <= 2 else _JSON_NESTING).search(data, pos)) is not None:
        pos, char = token.end(), data[token.start()]
        if char in b"[{":
            if depth == 1:  # a call begins
                spans.append(None)
                field = 0
            depth += 1
        elif depth == 2 and char in b",]}":  # a call's field ends
            if field == INPUT:
                spans[-1] = (start, token.start())
            field += 1
            start = pos
            if char != 0x2C:  # not a comma: the call's end
                depth -= 1
        elif char in b"]}":
            depth -= 1
    if depth:
        raise ValueError("the frame ends inside a call")
    return spans


# msgpack's types from 0xc0 on: (bytes of its length or count, bytes that follow them, items per count: 0 for none)
_PACKED: dict[int, tuple[int, int, int]] = {
    0xC0: (0, 0, 0), 0xC2: (0, 0, 0), 0xC3: (0, 0, 0),  # nil, false, true
    0xC4: (1, 0, 0), 0xC5: (2, 0, 0), 0xC6: (4, 0, 0),  # bin
    0xC7: (1, 1, 0), 0xC8: (2, 1, 0), 0xC9: (4, 1, 0),  # ext (its type, then its data)
    0xCA: (0, 4, 0), 0xCB: (0, 8, 0),  # float
    0xCC: (0, 1, 0), 0xCD: (0, 2, 0), 0xCE: (0, 4, 0), 0xCF: (0, 8, 0),  # uint
    0xD0: (0, 1, 0), 0xD1: (0, 2, 0), 0xD2: (0, 4, 0), 0xD3: (0, 8, 0),  # int
    0xD4: (0, 2, 0), 0xD5: (0, 3, 0), 0xD6: (0, 5, 0), 0xD7: (0, 9, 0), 0xD8: (0, 17, 0),  # fixext
    0xD9: (1, 0, 0), 0xDA: (2, 0, 0), 0xDB: (4, 0, 0),  # str
    0xDC: (2, 0, 1), 0xDD: (4, 0, 1), 0xDE: (2, 0, 2), 0xDF: (4, 0, 2),  # array, map
}


def packed_spans(data: bytes) -> list[Span]:
    """Where each call's input is in a msgpack frame (an array of arrays), found by skipping values without
    recursion."""
    spans: list[Span] = []
    calls, pos = _array(data, 0)
    for _ in range(calls):
        fields, pos = _array(data, pos)
        spans.append(None)
        for field in range(fields):
            end = packed_end(data, pos)
            if field == INPUT:
                spans[-1] = (pos, end)
            pos = end
    if pos != len(data):
        raise ValueError("bytes after the frame's last call")
    return spans


def _array(data: bytes, pos: int) -> tuple[int, int]:
    """The count of the msgpack array at ``pos``, and where its items begin."""
    kind = data[pos]
    if 0x90 <= kind <= 0x9F:
        return kind & 0x0F, pos + 1
    size = {0xDC: 2, 0xDD: 4}.get(kind)
    if size is None:
        raise ValueError(f"not an array at byte {pos}")
    return int.from_bytes(data[pos + 1:pos + 1 + size], "big"), pos + 1 + size


def packed_end(data: bytes, pos: int) -> int:
    """Where the msgpack value at ``pos`` ends (arrays and maps counted, never recursed into)."""
    left = 1
    while left:
        left -= 1
        if pos >= len(data):
            raise ValueError("the frame ends inside a value")
        kind = data[pos]
        if kind < 0x80 or kind >= 0xE0:  # fixint
            pos += 1
        elif kind < 0xA0:  # fixmap (a key and a value each), fixarray
            left += (kind & 0x0F) * (2 if kind < 0x90 else 1)
            pos += 1
        elif kind < 0xC0:  # fixstr
            pos += 1 + (kind & 0x1F)
        else:
            size, fixed, items = _PACKED[kind]
            count = int.from_bytes(data[pos + 1:pos + 1 + size], "big")
            left += count * items
            pos += 1 + size + fixed + (0 if items else count)
    return pos
