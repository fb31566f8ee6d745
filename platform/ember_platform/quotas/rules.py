"""What a quota may say, and whom it concerns: pure functions of its record."""

from __future__ import annotations

import math
from fnmatch import fnmatchcase

from ember._errors import InvalidInputError
from ember.wire.quotas import MAX_COUNT, MAX_GPU_MEMORY_MB, MAX_RATE_PER_S, QUOTA_NAME, Quota, QuotaRequest
from ember.wire.tokens import TOKEN_ID
from ember_platform.auth.scopes import APP_PATTERN


def check_name(name: str) -> str:
    """``name`` if it can name a quota; ``InvalidInputError`` naming ``name`` if not."""
    if not QUOTA_NAME.fullmatch(name):
        shown = name if len(name) <= 40 else name[:40] + "..."
        raise InvalidInputError(f"quota name {shown!r}: 1 to 63 of lowercase letters, digits and '-'", field="quota")
    return name


def check_request(name: str, req: QuotaRequest, *, now: float, by: str = "") -> Quota:
    """The quota ``req`` asks for under ``name``; ``InvalidInputError`` (422) naming the field at fault."""
    check_name(name)
    if (req.apps is None) == (req.token is None):
        raise InvalidInputError("a quota has one subject: apps (an app name or glob) or token (a token id)",
                                field="$.apps")
    if req.apps is not None and not APP_PATTERN.fullmatch(req.apps):
        raise InvalidInputError(f"apps {req.apps[:80]!r}: 1 to 63 of lowercase letters, digits, '-' and the globs "
                                "'*' and '?'", field="$.apps")
    if req.token is not None and not TOKEN_ID.fullmatch(req.token):
        raise InvalidInputError(f"token {req.token[:40]!r}: a token id, 1 to 32 lowercase letters and digits",
                                field="$.token")
    for field, value, high in (("max_replicas", req.max_replicas, MAX_COUNT),
                               ("max_gpu_memory_mb", req.max_gpu_memory_mb, MAX_GPU_MEMORY_MB),
                               ("max_concurrent_calls", req.max_concurrent_calls, MAX_COUNT),
                               ("burst", req.burst, MAX_COUNT)):
        low = 1 if field == "burst" else 0
        if value is not None and not low <= value <= high:
            raise InvalidInputError(f"{field}: a whole number from {low} to {high}", field=f"$.{field}")
        if req.token is not None and value is not None and field in ("max_replicas", "max_gpu_memory_mb"):
            raise InvalidInputError(f"{field} limits the apps of an apps quota; a token quota limits calls "
                                    "(max_concurrent_calls, rate_per_s)", field=f"$.{field}")
    rate = req.rate_per_s
    if rate is not None and not (math.isfinite(rate) and 0 < rate <= MAX_RATE_PER_S):
        raise InvalidInputError(f"rate_per_s: calls per second, above 0 and at most {MAX_RATE_PER_S:.0f}",
                                field="$.rate_per_s")
    if req.burst is not None and rate is None:
        raise InvalidInputError("burst goes with rate_per_s", field="$.burst")
    if all(v is None for v in (req.max_replicas, req.max_gpu_memory_mb, req.max_concurrent_calls, rate)):
        raise InvalidInputError("a quota needs at least one limit: max_replicas, max_gpu_memory_mb, "
                                "max_concurrent_calls or rate_per_s", field="$")
    burst = req.burst if req.burst is not None else max(1, math.ceil(rate)) if rate is not None else None
    return Quota(name=name, apps=req.apps, token=req.token, max_replicas=req.max_replicas,
                 max_gpu_memory_mb=req.max_gpu_memory_mb, max_concurrent_calls=req.max_concurrent_calls,
                 rate_per_s=rate, burst=burst, created_at=now, created_by=by)


def covers_app(quota: Quota, app: str) -> bool:
    """Whether ``quota``'s app pattern matches ``app`` (never, for a token quota)."""
    return quota.apps is not None and (quota.apps == app or fnmatchcase(app, quota.apps))


def applies_to_call(quota: Quota, app: str, token_id: str) -> bool:
    """Whether a call of ``app`` made with the token ``token_id`` ("" for none) counts against ``quota``."""
    return covers_app(quota, app) or (bool(token_id) and quota.token == token_id)


def limits_calls(quota: Quota) -> bool:
    return quota.max_concurrent_calls is not None or quota.rate_per_s is not None


def limits_placement(quota: Quota) -> bool:
    return quota.apps is not None and (quota.max_replicas is not None or quota.max_gpu_memory_mb is not None)
