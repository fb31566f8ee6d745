"""Quotas through the platform's API (admin): set, list with usage, remove; and the CLI's spellings of their
limits (``80GB``, ``50/s``)."""

from __future__ import annotations

import re

import msgspec

from ember._client import Transport, default_transport
from ember._errors import InvalidInputError
from ember.wire import Quota, QuotaRequest, QuotaView, encoder

_JSON = {"content-type": "application/json"}
_MEMORY = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(GB|GIB|MB|MIB|TB|TIB)?\s*", re.IGNORECASE)
_RATE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*(?:/\s*(s|m|h))?\s*")
_MB_PER = {"MB": 1, "MIB": 1, "GB": 1024, "GIB": 1024, "TB": 1024 * 1024, "TIB": 1024 * 1024}
_S_PER = {"s": 1, "m": 60, "h": 3600}


def parse_memory_mb(text: str) -> int:
    """MB in ``80GB``, ``512MB``, ``1TB`` or a bare number of MB (GB are 1024 MB, as GPUs count them)."""
    found = _MEMORY.fullmatch(text)
    if not found:
        raise InvalidInputError(f"GPU memory {text!r}: a size such as 80GB or 512MB", field="--gpu-memory")
    return round(float(found[1]) * _MB_PER[(found[2] or "MB").upper()])


def parse_rate(text: str) -> float:
    """Calls per second in ``50/s``, ``600/m``, ``1000/h`` or a bare number (per second)."""
    found = _RATE.fullmatch(text)
    if not found or float(found[1]) <= 0:
        raise InvalidInputError(f"rate {text!r}: calls per second, minute or hour, such as 50/s or 600/m",
                                field="--rate")
    return float(found[1]) / _S_PER[found[2] or "s"]


def set_quota(name: str, request: QuotaRequest, transport: Transport | None = None) -> Quota:
    """Set (create or replace) the quota ``name``."""
    response = (transport or default_transport()).request("PUT", f"/v1/quotas/{name}",
                                                          content=encoder.encode(request), headers=_JSON)
    return msgspec.json.decode(response.content, type=Quota)


def list_quotas(transport: Transport | None = None) -> list[QuotaView]:
    """Every quota, with what its subject uses now."""
    response = (transport or default_transport()).request("GET", "/v1/quotas")
    return msgspec.json.decode(response.content, type=list[QuotaView])


def remove_quota(name: str, transport: Transport | None = None) -> Quota:
    response = (transport or default_transport()).request("DELETE", f"/v1/quotas/{name}")
    return msgspec.json.decode(response.content, type=Quota)
