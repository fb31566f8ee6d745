"""The Open Inference Protocol's HTTP bodies (KServe v2, Triton's HTTP API): what ``/v2`` routes take and answer.

Inference requests come from any client (``tritonclient``, KServe's, curl): every field is checked by the gateway
(``ember_platform.gateway.oip``) before anything reaches a replica. A tensor's ``data`` is nested or flat lists
in JSON, or absent when ``parameters.binary_data_size`` says how many of the bytes after the JSON header are its.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ember.wire.tensors import TensorMeta


class InferInput(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    shape: list[int]
    datatype: str
    parameters: dict[str, Any] = {}
    data: Any = None


class RequestedOutput(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    parameters: dict[str, Any] = {}


class InferRequest(msgspec.Struct, frozen=True, kw_only=True):
    """``POST /v2/models/<model>[/versions/<v>]/infer``: the JSON header of the body."""

    inputs: list[InferInput]
    id: str | None = None
    parameters: dict[str, Any] = {}
    outputs: list[RequestedOutput] | None = None  # None: every output


class InferOutput(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str
    datatype: str
    shape: list[int]
    parameters: dict[str, Any] = {}
    data: list[Any] | None = None  # None: its bytes follow the JSON header (``parameters.binary_data_size``)


class InferResponse(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    model_name: str
    outputs: list[InferOutput]
    model_version: str = ""
    id: str | None = None


class ModelMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v2/models/<model>[/versions/<v>]``."""

    name: str
    versions: list[str]
    platform: str
    inputs: list[TensorMeta]
    outputs: list[TensorMeta]


class ModelReady(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    ready: bool


class ServerMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v2``."""

    name: str
    version: str
    extensions: list[str]


class RepositoryModel(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One model of ``POST /v2/repository/index``."""

    name: str
    version: str
    state: str  # READY or UNAVAILABLE
    reason: str = ""


class IndexRequest(msgspec.Struct, frozen=True, kw_only=True):
    ready: bool = False  # only the models that are ready


class OipError(msgspec.Struct, frozen=True, kw_only=True):
    """Every ``/v2`` error: ``{"error": "<message>"}``, as the protocol (and ``tritonclient``) reads it."""

    error: str
