"""Bearer tokens: their format, the records the control plane keeps of them, and the bodies of ``/v1/tokens``.

A token reads ``ember_<id>_<secret>``. The id is public: it names the token in ``ember token ls`` and
``ember token revoke ID``. The secret is 32 url-safe characters from ``secrets`` (192 bits); the platform stores
only its sha256, in the ``ember_tokens`` bucket under the id, and shows the whole token once, when it is created.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from ember.wire import bounds

TOKEN_PREFIX = "ember_"
SCOPES = ("admin", "deploy", "invoke", "read", "events")
TOKEN_ID = re.compile(bounds.TOKEN_ID)
MAX_TOKEN_APPS = 100
MAX_TOKEN_NAME = 64
TOKEN_NAME = "^[^\\x00-\\x1f\\x7f-\\x9f\\u2028\\u2029]*$"  # no control characters (a name is shown in logs)
TOKEN_TTL = r"([0-9]{1,7})([smhd])"
_SECRET = re.compile(r"[A-Za-z0-9_-]{32,128}")
_ID_BYTES = 6  # 12 hex characters: ids need only be unique (each is created only if absent), not secret
_SECRET_BYTES = 24  # 32 url-safe characters, 192 bits


class TokenInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What a token may do, as ``GET /v1/tokens`` shows it (never its secret)."""

    id: str
    name: str
    scopes: list[str]  # of SCOPES; admin implies every other, deploy implies read
    apps: list[str]  # app names or glob patterns (``team-a-*``) the token sees; admin tokens see every app
    created_at: float
    expires_at: float | None = None  # seconds since the epoch; None: until revoked
    created_by: str = ""  # the id of the token that created it; "" for a bootstrap token


class StoredToken(msgspec.Struct, frozen=True, kw_only=True):
    """A token as the ``ember_tokens`` bucket keeps it, under its id. A revoked token keeps its record, marked, so
    that its id is never issued again and the first start's admin token is printed only once."""

    info: TokenInfo
    secret_sha256: str
    revoked_at: float | None = None
    # Written from a control plane's bootstrap file: kept when revoked, however long ago (the same file given again
    # at a start would make a purged record anew, live).
    bootstrap: bool = False


class TokenRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/tokens`` (``ember token create``). ``ttl``: ``30d``, ``12h``, ``15m``, ``90s``, or none."""

    scopes: Annotated[list[Literal["admin", "deploy", "invoke", "read", "events"]], Meta(min_length=1)]
    apps: Annotated[list[bounds.AppPattern], Meta(min_length=1, max_length=MAX_TOKEN_APPS)] = msgspec.field(
        default_factory=lambda: ["*"])
    name: Annotated[str, Meta(max_length=MAX_TOKEN_NAME, pattern=TOKEN_NAME)] = ""
    ttl: Annotated[str, Meta(pattern=bounds.anchored(TOKEN_TTL))] | None = None


class NewToken(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to ``POST /v1/tokens``: the token itself, shown this once, and its record."""

    token: str
    info: TokenInfo


def new_token(token_id: str | None = None) -> str:
    """A fresh token, ``ember_<id>_<secret>``: a random id unless one is given, and a random secret."""
    token_id = token_id if token_id is not None else secrets.token_hex(_ID_BYTES)
    if not TOKEN_ID.fullmatch(token_id):
        raise ValueError(f"a token id is 1 to 32 lowercase letters and digits, not {token_id!r}")
    return f"{TOKEN_PREFIX}{token_id}_{secrets.token_urlsafe(_SECRET_BYTES)}"


def parse_token(token: str) -> tuple[str, str] | None:
    """``(id, secret)`` of a well-formed token; None for anything else."""
    if not token.startswith(TOKEN_PREFIX):
        return None
    token_id, sep, secret = token[len(TOKEN_PREFIX):].partition("_")
    if not sep or not TOKEN_ID.fullmatch(token_id) or not _SECRET.fullmatch(secret):
        return None
    return token_id, secret


def secret_digest(secret: str) -> str:
    """What the platform stores of a token's secret."""
    return hashlib.sha256(secret.encode()).hexdigest()
