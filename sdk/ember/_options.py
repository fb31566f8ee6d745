"""The decorators' resource and scaling options, checked at decoration time into the fields of a ``ServiceSpec``."""

from __future__ import annotations

import math
import re
from typing import Any

from ember._errors import InvalidSpecError
from ember._resources import GpuRequest, parse_gpu
from ember.wire import Retries
from ember.wire.secrets import MAX_SECRETS_PER_SERVICE, name_problem
from ember.wire.validate import (
    MAX_BUFFER_REPLICAS,
    MAX_HOST_MEMORY_MB,
    MAX_REPLICAS,
    MAX_SCALEDOWN_WINDOW_S,
    MAX_TIMEOUT_S,
)


def resources(where: str, gpu: Any, min_replicas: Any, max_replicas: Any, timeout_s: Any,
               retries: Any = 0) -> dict[str, Any]:
    if not int_in(min_replicas, 0, MAX_REPLICAS):
        raise InvalidSpecError(f"{where}(min_replicas={min_replicas!r}): min_replicas is an int >= 0 and "
                               f"at most {MAX_REPLICAS}")
    if max_replicas is None:
        max_replicas = max(min_replicas, 1)
    if not int_in(max_replicas, max(min_replicas, 1), MAX_REPLICAS):
        raise InvalidSpecError(
            f"{where}(max_replicas={max_replicas!r}): max_replicas is an int >= 1 and >= min_replicas "
            f"({min_replicas}), at most {MAX_REPLICAS}")
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, int | float) or not 0 < timeout_s <= MAX_TIMEOUT_S:
        raise InvalidSpecError(f"{where}(timeout_s={timeout_s!r}): timeout_s is a number of seconds in (0, 86400]")
    return {**_parse_gpu(where, gpu), "min_replicas": min_replicas, "max_replicas": max_replicas,
            "timeout_s": float(timeout_s), "retries": _retries(where, retries)}


def int_in(value: Any, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def scaling(where: str, buffer_replicas: Any, scaledown_window_s: Any, target_p95_ms: Any) -> dict[str, Any]:
    if not int_in(buffer_replicas, 0, MAX_BUFFER_REPLICAS):
        raise InvalidSpecError(f"{where}(buffer_replicas={buffer_replicas!r}): an int from 0 to "
                               f"{MAX_BUFFER_REPLICAS}")
    if isinstance(scaledown_window_s, bool) or not isinstance(scaledown_window_s, int | float) \
            or not 0 <= scaledown_window_s <= MAX_SCALEDOWN_WINDOW_S:
        raise InvalidSpecError(f"{where}(scaledown_window_s={scaledown_window_s!r}): seconds from 0 to 86400")
    if target_p95_ms is not None and (isinstance(target_p95_ms, bool) or not isinstance(target_p95_ms, int | float)
                                      or not 0 < target_p95_ms < math.inf):
        raise InvalidSpecError(f"{where}(target_p95_ms={target_p95_ms!r}): target_p95_ms is a positive number of "
                               "milliseconds (e.g. target_p95_ms=250), or None for no latency target")
    return {"buffer_replicas": buffer_replicas, "scaledown_window_s": float(scaledown_window_s),
            "target_p95_ms": None if target_p95_ms is None else float(target_p95_ms)}


def startup(where: str, startup_timeout_s: Any) -> dict[str, Any]:
    if isinstance(startup_timeout_s, bool) or not isinstance(startup_timeout_s, int | float) \
            or not 0 < startup_timeout_s <= MAX_TIMEOUT_S:
        raise InvalidSpecError(f"{where}(startup_timeout_s={startup_timeout_s!r}): seconds in (0, {MAX_TIMEOUT_S:g}]")
    return {"startup_timeout_s": float(startup_timeout_s)}


def secrets(where: str, secrets: Any) -> dict[str, Any]:
    """``secrets=``: a list of secret names; None: none."""
    if secrets is None:
        return {}
    if isinstance(secrets, str) or not isinstance(secrets, list | tuple) \
            or not all(isinstance(n, str) for n in secrets):
        raise InvalidSpecError(f"{where}(secrets={secrets!r}): a list of secret names, e.g. secrets=['hf']")
    for name in secrets:
        problem = name_problem(name)
        if problem:
            raise InvalidSpecError(f"{where}(secrets=...): {problem}")
    if len(set(secrets)) != len(secrets) or len(secrets) > MAX_SECRETS_PER_SERVICE:
        raise InvalidSpecError(f"{where}(secrets={secrets!r}): at most {MAX_SECRETS_PER_SERVICE} names, each once")
    return {"secrets": list(secrets)}


def host_memory(where: str, memory: Any) -> dict[str, Any]:
    """``memory=``: MB as an int, or a string such as ``"4GB"`` or ``"512MB"``; None: not declared."""
    if memory is None:
        return {}
    mb: float | None = None
    if isinstance(memory, int) and not isinstance(memory, bool):
        mb = memory
    elif isinstance(memory, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(GB|MB)\s*", memory, re.IGNORECASE)
        if match:
            mb = float(match[1]) * (1024 if match[2].upper() == "GB" else 1)
    if mb is None or not 0 < mb <= MAX_HOST_MEMORY_MB:
        raise InvalidSpecError(f"{where}(memory={memory!r}): host memory in MB (an int) or a string such as "
                               "'4GB' or '512MB'")
    return {"memory_mb": round(mb)}


def _retries(where: str, retries: Any) -> Retries:
    if isinstance(retries, Retries):
        return retries
    if isinstance(retries, int) and not isinstance(retries, bool) and 0 <= retries <= 100:
        return Retries(max_retries=retries)
    raise InvalidSpecError(f"{where}(retries={retries!r}): a count from 0 to 100, or ember.Retries(max_retries=..., "
                           "initial_delay_s=..., backoff_coefficient=...)")


def _parse_gpu(where: str, gpu: Any) -> dict[str, Any]:
    """The ``gpu=`` argument as the manifest carries it: a full request, and the count and types."""
    request = parse_gpu(gpu, where=where)
    if request == GpuRequest():
        return {"gpu_count": 0, "gpu_types": [], "gpu": None}
    return {"gpu_count": max(request.count, 1), "gpu_types": list(request.types), "gpu": request}
