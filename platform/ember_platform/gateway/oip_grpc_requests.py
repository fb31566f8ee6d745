"""gRPC's inference requests as the protocol's checks read them, and Ember's errors as gRPC status codes.

A ``ModelInferRequest`` becomes the ``InferRequest`` HTTP's JSON header decodes to (its parameters as plain values,
each input's typed ``contents`` as its ``data``), and its ``raw_input_contents`` a ``Binary`` source, so that
``oip_infer.inputs`` checks both transports' tensors alike. Nothing here imports the generated messages: it reads
any message of the protocol's shape (tritonclient's own, in the unit tests).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import grpc

from ember._errors import BadRequestError, EmberError
from ember.wire.oip import InferInput, InferRequest, RequestedOutput
from ember.wire.tensors import DATATYPES

# Where each datatype's elements go in ``InferTensorContents`` (FP16 has no field: it goes raw).
CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
            "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
            "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
            "FP64": "fp64_contents"}
# Triton's mapping of errors to codes, by the HTTP status Ember gives each error.
_CODES = {400: grpc.StatusCode.INVALID_ARGUMENT, 401: grpc.StatusCode.UNAUTHENTICATED,
          403: grpc.StatusCode.PERMISSION_DENIED, 404: grpc.StatusCode.NOT_FOUND,
          409: grpc.StatusCode.FAILED_PRECONDITION, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
          415: grpc.StatusCode.INVALID_ARGUMENT, 422: grpc.StatusCode.INVALID_ARGUMENT,
          429: grpc.StatusCode.RESOURCE_EXHAUSTED, 499: grpc.StatusCode.CANCELLED, 500: grpc.StatusCode.INTERNAL,
          501: grpc.StatusCode.UNIMPLEMENTED, 502: grpc.StatusCode.UNAVAILABLE, 503: grpc.StatusCode.UNAVAILABLE,
          504: grpc.StatusCode.DEADLINE_EXCEEDED}


def status_of(exc: EmberError) -> grpc.StatusCode:
    """The gRPC status code of an error, as Triton's: a bad request is INVALID_ARGUMENT, an unknown model NOT_FOUND,
    an overload (429) or a message over the limit RESOURCE_EXHAUSTED, the model's own error INTERNAL."""
    code = _CODES.get(exc.http_status)
    if code is not None:
        return code
    return grpc.StatusCode.INTERNAL if exc.http_status >= 500 else grpc.StatusCode.INVALID_ARGUMENT


def parameters(given: Any) -> dict[str, Any]:
    """A map of ``InferParameter`` as plain values (a parameter with no value set is left out)."""
    values = {}
    for key, param in given.items():
        which = param.WhichOneof("parameter_choice")
        if which is not None:
            values[key] = getattr(param, which)
    return values


class RawContents:
    """gRPC's ``raw_input_contents``: one input's bytes each, in the order of the inputs (or none at all)."""

    data_name = "contents"
    binary_name = "raw_input_contents"

    def __init__(self, raw: Sequence[bytes], inputs: int) -> None:
        if raw and len(raw) != inputs:
            raise BadRequestError(f"{len(raw)} raw_input_contents for {inputs} inputs: give one per input, in the "
                                  "inputs' order, or none", field="raw_input_contents")
        self.raw = raw

    def left(self) -> int:
        return 0

    def take(self, index: int, given: InferInput, at: str, expected: int) -> bytes | None:
        if not self.raw:
            return None
        data = self.raw[index]
        if len(data) != expected:
            raise BadRequestError(f"input {given.name!r}: raw_input_contents[{index}] has {len(data)} bytes, but a "
                                  f"{given.datatype} tensor of shape {list(given.shape)} has {expected}",
                                  field=f"raw_input_contents[{index}]")
        return bytes(data)

    def finish(self) -> None:
        pass


def infer_request(request: Any) -> tuple[InferRequest, RawContents]:
    """A ``ModelInferRequest`` as HTTP's JSON header would say it, and its raw contents."""
    raw = request.raw_input_contents
    inputs = [_input(i, given, bool(raw)) for i, given in enumerate(request.inputs)]
    outputs = [RequestedOutput(name=o.name, parameters=parameters(o.parameters)) for o in request.outputs]
    req = InferRequest(inputs=inputs, id=request.id or None, parameters=parameters(request.parameters),
                       outputs=outputs or None)
    return req, RawContents(raw, len(inputs))


def _input(index: int, given: Any, raw: bool) -> InferInput:
    at = f"inputs[{index}]"
    data = None
    typed = [field.name for field, _ in given.contents.ListFields()] if given.HasField("contents") else []
    if typed and raw:
        raise BadRequestError(f"input {given.name!r}: its elements are in contents, and raw_input_contents are given "
                              "too: give one or the other", field=f"{at}.contents")
    if not raw and given.datatype in DATATYPES:
        wanted = CONTENTS.get(given.datatype)
        if typed and typed != [wanted]:
            where = f"contents.{wanted}" if wanted else "raw_input_contents (it has no typed contents)"
            raise BadRequestError(f"input {given.name!r}: {given.datatype} elements go in {where}, not in "
                                  f"{', '.join(f'contents.{f}' for f in typed)}", field=f"{at}.contents")
        if typed:
            data = list(getattr(given.contents, typed[0]))
        elif given.HasField("contents") or 0 in given.shape:  # an empty tensor gives no elements (never a product of
            # the sizes here: they are checked later, and 30,000 sizes of 2**62 took seconds of the event loop)
            data = []
    return InferInput(name=given.name, shape=list(given.shape), datatype=given.datatype,
                      parameters=parameters(given.parameters), data=data)
