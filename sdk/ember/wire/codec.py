"""The JSON encoder and the decoders of the messages read on hot paths, built once."""

from __future__ import annotations

from typing import Any

import msgspec

from ember._errors import RemoteError
from ember.wire.calls import Answer, Invocation
from ember.wire.nodes import LoadReport, LogLine, NodeAssignment, NodeInfo, ReplicaStatus
from ember.wire.specs import Deployment

encoder = msgspec.json.Encoder()
invocations_decoder = msgspec.json.Decoder(list[Invocation])
answers_decoder = msgspec.json.Decoder(list[Answer])
deployment_decoder = msgspec.json.Decoder(Deployment)
replica_decoder = msgspec.json.Decoder(ReplicaStatus)
node_decoder = msgspec.json.Decoder(NodeInfo)
log_decoder = msgspec.json.Decoder(LogLine)
assignment_decoder = msgspec.json.Decoder(NodeAssignment)
load_decoder = msgspec.json.Decoder(LoadReport)


def encode_output(value: Any) -> bytes:
    """A function's output as JSON; ``RemoteError`` (the user's fault, not the platform's) when it is not JSON-able."""
    try:
        return encoder.encode(value)
    except (TypeError, ValueError) as exc:
        raise RemoteError(f"the output is not JSON-able: {exc}", remote_type=type(exc).__name__) from exc
