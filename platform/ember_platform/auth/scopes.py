"""What a token may do, as pure functions of its record: scopes, app patterns, time to live.

| scope | allows |
| --- | --- |
| ``admin`` | everything, on every app: tokens, secrets and quotas |
| ``deploy`` | push (upload a bundle, deploy), scale, delete an app; it implies ``read`` (a push watches its rollout) |
| ``invoke`` | call, spawn, read and cancel the calls of its apps, replay their dead letters |
| ``read`` | list and show apps, status, logs, metrics, dead letters, the OpenAPI document |
| ``events`` | publish events to the subjects its apps' functions are bound to (``on=``) and read their results: as a
plain NATS client (``ember_platform.natsauth.clients``) or through ``POST /v1/events/<subject>`` |

A token sees the apps its patterns match (``hello``, ``team-a-*``: app-name characters and the globs ``*`` and
``?``); an app it does not see is answered exactly as an app that does not exist (404).
"""

from __future__ import annotations

import math
import re
from fnmatch import fnmatchcase
from typing import Literal

from ember._errors import ForbiddenError, InvalidInputError, NotFoundError
from ember.wire import bounds
from ember.wire.tokens import SCOPES, TOKEN_NAME, TOKEN_TTL, TokenInfo, TokenRequest

Scope = Literal["admin", "deploy", "invoke", "read", "events"]
ADMIN: Scope = "admin"
DEPLOY: Scope = "deploy"
INVOKE: Scope = "invoke"
READ: Scope = "read"
EVENTS: Scope = "events"
_IMPLIES: dict[str, frozenset[str]] = {
    "admin": frozenset(SCOPES),
    "deploy": frozenset({"deploy", "read"}),
    "invoke": frozenset({"invoke"}),
    "read": frozenset({"read"}),
    "events": frozenset({"events"}),
}
APP_PATTERN = re.compile(bounds.APP_PATTERN)
MAX_PATTERNS = 100
MAX_NAME = 64
_TTL = re.compile(TOKEN_TTL)
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}
MAX_TTL_S = 3650 * 86400  # ten years


def granted(scopes: list[str]) -> frozenset[str]:
    """Every scope that ``scopes`` allow, with what they imply."""
    return frozenset().union(*(_IMPLIES.get(s, frozenset()) for s in scopes))


def no_such_app(app: str) -> NotFoundError:
    """The 404 of an app that is not deployed, word for word the registry's: an app a token may not see gets it."""
    return NotFoundError(f"no app named {app!r} is deployed")


class Principal:
    """What one token may do: its granted scopes and the apps it sees."""

    __slots__ = ("all_apps", "exact", "globs", "scopes", "token_id")

    def __init__(self, token_id: str, scopes: frozenset[str], apps: list[str]) -> None:
        self.token_id = token_id
        self.scopes = scopes
        self.all_apps = "admin" in scopes or "*" in apps
        self.exact = frozenset(p for p in apps if not any(c in p for c in "*?"))
        self.globs = tuple(p for p in apps if p not in self.exact)

    @classmethod
    def of(cls, info: TokenInfo) -> Principal:
        return cls(info.id, granted(info.scopes), info.apps)

    def sees(self, app: str) -> bool:
        return self.all_apps or app in self.exact or any(fnmatchcase(app, p) for p in self.globs)

    def may(self, scope: str) -> bool:
        return scope in self.scopes

    def require(self, scope: str, app: str | None = None) -> None:
        """``NotFoundError`` for an app the token does not see, as for one that does not exist; then
        ``ForbiddenError`` without ``scope``."""
        if app is not None and not self.sees(app):
            raise no_such_app(app)
        if scope not in self.scopes:
            held = ", ".join(sorted(self.scopes)) or "none"
            raise ForbiddenError(f"this token's scopes ({held}) do not allow this: it needs {scope!r}",
                                 field="Authorization")


# Every scope, every app: the principal of a control plane that checks no tokens (``--insecure-no-auth``).
EVERYONE = Principal("", frozenset(SCOPES), ["*"])


def parse_ttl(text: str, field: str = "$.ttl") -> float:
    """Seconds in ``30d``, ``12h``, ``15m`` or ``90s`` (1 second to ten years); ``InvalidInputError`` naming
    ``field`` otherwise."""
    found = _TTL.fullmatch(text) if isinstance(text, str) else None
    seconds = int(found[1]) * _UNIT_S[found[2]] if found else 0
    if not 0 < seconds <= MAX_TTL_S:
        shown = text if len(str(text)) <= 40 else str(text)[:40] + "..."
        raise InvalidInputError(f"ttl {shown!r}: a whole number and a unit, s, m, h or d (30d, 12h, 15m, 90s), "
                                f"from 1s to {MAX_TTL_S // 86400}d", field=field)
    return float(seconds)


def check_request(req: TokenRequest) -> tuple[list[str], list[str], float]:
    """The scopes (sorted, unique), app patterns and time to live (``math.inf``: none) of a token request;
    ``InvalidInputError`` naming the field at fault."""
    if not req.scopes:
        raise InvalidInputError(f"a token needs at least one scope, of {', '.join(SCOPES)}", field="$.scopes")
    for i, scope in enumerate(req.scopes):
        if scope not in SCOPES:
            raise InvalidInputError(f"unknown scope {scope[:40]!r}: one of {', '.join(SCOPES)}",
                                    field=f"$.scopes[{i}]")
    if not 1 <= len(req.apps) <= MAX_PATTERNS:
        raise InvalidInputError(f"apps: 1 to {MAX_PATTERNS} app names or patterns ('*' for every app)",
                                field="$.apps")
    for i, pattern in enumerate(req.apps):
        if not APP_PATTERN.fullmatch(pattern):
            shown = pattern if len(pattern) <= 80 else pattern[:80] + "..."
            raise InvalidInputError(f"app pattern {shown!r}: 1 to 63 of lowercase letters, digits, '-' and the globs "
                                    "'*' and '?'", field=f"$.apps[{i}]")
    if "admin" in req.scopes and req.apps != ["*"]:
        raise InvalidInputError("an admin token covers every app: give apps ['*'] (or leave it out)", field="$.apps")
    if len(req.name) > MAX_NAME or not re.search(TOKEN_NAME, req.name):
        raise InvalidInputError(f"name: at most {MAX_NAME} characters, no control characters", field="$.name")
    ttl = parse_ttl(req.ttl) if req.ttl is not None else math.inf
    return sorted(set(req.scopes)), list(dict.fromkeys(req.apps)), ttl
