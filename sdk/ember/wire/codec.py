"""The JSON encoder and the decoders of the messages read on hot paths, built once."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import msgspec

from ember._errors import RemoteError
from ember.wire.calls import Answer, Invocation
from ember.wire.nodes import LoadReport, LogLine, NodeAssignment, NodeInfo, ReplicaStatus
from ember.wire.specs import Deployment
from ember.wire.tensors import compact_of

encoder = msgspec.json.Encoder()
invocations_decoder = msgspec.json.Decoder(list[Invocation])
answers_decoder = msgspec.json.Decoder(list[Answer])
deployment_decoder = msgspec.json.Decoder(Deployment)
replica_decoder = msgspec.json.Decoder(ReplicaStatus)
node_decoder = msgspec.json.Decoder(NodeInfo)
log_decoder = msgspec.json.Decoder(LogLine)
assignment_decoder = msgspec.json.Decoder(NodeAssignment)
load_decoder = msgspec.json.Decoder(LoadReport)


packed_encoder = msgspec.msgpack.Encoder()
packed_invocations_decoder = msgspec.msgpack.Decoder(list[Invocation])
packed_answers_decoder = msgspec.msgpack.Decoder(list[Answer])


def is_json_frame(data: bytes) -> bool:
    """Whether a frame of invocations or answers is JSON (else msgpack): a JSON list starts with ``[``, a byte that
    starts no msgpack array."""
    return data[:1] == b"["


def _array_like(value: Any) -> Any:
    """Arrays (numpy's, torch's) and numpy scalars as plain lists and numbers, for JSON and plain msgpack."""
    tolist = getattr(value, "tolist", None)
    if tolist is not None and type(value).__module__.partition(".")[0] in ("numpy", "torch"):
        return tolist()
    raise TypeError(f"Encoding objects of type {type(value).__name__} is unsupported")


def _compact(value: Any) -> Any:
    """Arrays as compact tensors (msgpack extensions), for the Open Inference Protocol."""
    if type(value).__module__.partition(".")[0] in ("numpy", "torch"):
        return compact_of(value)
    return _array_like(value)


json_args_encoder = msgspec.json.Encoder(enc_hook=_array_like)  # a call's arguments, arrays among them
_output_encoders: dict[tuple[str, bool], msgspec.json.Encoder | msgspec.msgpack.Encoder] = {
    ("json", False): msgspec.json.Encoder(enc_hook=_array_like),
    ("msgpack", False): msgspec.msgpack.Encoder(enc_hook=_array_like),
    ("msgpack", True): msgspec.msgpack.Encoder(enc_hook=_compact),
}


def encode_output(value: Any, codec: str = "json", compact: bool = False) -> bytes:
    """A function's output as JSON (or msgpack; arrays as compact tensors with ``compact``); ``RemoteError`` (the
    user's fault, not the platform's) when it is not JSON-able, or, in JSON, holds an infinity or a NaN: JSON has
    neither, and the encoder would have written ``null`` silently (``remote_type`` ``InvalidOutput``, naming the
    field). A function that has no number to give returns None (and declares ``float | None``). An output that holds
    itself, or an integer beyond 64 bits in msgpack, is ``InvalidOutput`` too."""
    try:
        encoded = _output_encoders[codec, compact and codec == "msgpack"].encode(value)
    except (TypeError, ValueError) as exc:
        raise RemoteError(f"the output is not JSON-able: {exc}", remote_type=type(exc).__name__) from exc
    except RecursionError as exc:
        raise RemoteError("the output cannot be encoded: it nests too deeply, or holds itself (a list in itself, "
                          "say)", remote_type="InvalidOutput") from exc
    except OverflowError as exc:  # msgpack's integers are 64 bits
        raise RemoteError(f"the output cannot be encoded in {codec}: {exc}", remote_type="InvalidOutput") from exc
    except Exception as exc:  # raised by the output's own code (an array's ``tolist``, a ``__len__``): still its call's
        raise RemoteError(f"the output cannot be encoded: {type(exc).__name__}: {exc}",
                          remote_type="InvalidOutput") from exc
    # Only an answer with a null in it is looked through: a substring search costs nothing on the others.
    if codec == "json" and b"null" in encoded and (where := non_finite(value)) is not None:
        raise RemoteError(f"the output is not JSON: {where} (JSON has no infinity or NaN; return None for a "
                          "number there is none of)", remote_type="InvalidOutput")
    return encoded


def non_finite(value: Any, path: str = "$", depth: int = 0) -> str | None:
    """Where ``value`` holds a float that is not finite (``$.total is inf``), or None. Arrays are read as lists."""
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{path} is {value}"
    if depth > 64 or isinstance(value, str | bytes | int | bool) or value is None:
        return None
    if isinstance(value, dict):
        items: Any = ((f"{path}.{key}", item) for key, item in value.items())
    elif isinstance(value, list | tuple | set | frozenset):
        items = ((f"{path}[{i}]", item) for i, item in enumerate(value))
    elif isinstance(value, msgspec.Struct):
        items = ((f"{path}.{name}", getattr(value, name)) for name in value.__struct_fields__)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((f"{path}.{f.name}", getattr(value, f.name)) for f in dataclasses.fields(value))
    elif type(value).__module__.partition(".")[0] in ("numpy", "torch") and hasattr(value, "tolist"):
        return non_finite(value.tolist(), path, depth + 1)
    else:
        return None
    for where, item in items:
        if (found := non_finite(item, where, depth + 1)) is not None:
            return found
    return None
