"""The bounds and patterns of the API's request fields, as msgspec constraints: one definition that both checks and
documents. msgspec enforces them as it decodes a body (a 422 naming the field), and ``/openapi.json`` shows them,
since its schemas are generated from the same Structs. What one field cannot say (rules across fields, or against
what the platform holds) stays in the handlers' checks, and the operation's description says it.

Patterns are anchored for both readers: ``^(?:...)$(?!\\n)`` — JSON Schema's (ECMA-262) ``$`` ends the string, but
Python's, which msgspec uses, also matches before a final newline; the lookahead refuses that newline there.
"""

from __future__ import annotations

from typing import Annotated

from msgspec import Meta


def anchored(regex: str) -> str:
    """``regex`` matching a whole string, alike in Python and in JSON Schema."""
    return f"^(?:{regex})$(?!\\n)"


MAX_REPLICAS = 1000  # per service; more than the control loop should ever place for one service
MAX_VERSION = 999_999_999
SHA256_HEX = r"[0-9a-f]{64}"
APP_PATTERN = r"[a-z0-9*?][a-z0-9*?-]{0,62}"  # an app name or a glob of them (tokens', quotas', grants' apps)
TOKEN_ID = r"[a-z0-9]{1,32}"

Sha256 = Annotated[str, Meta(pattern=anchored(SHA256_HEX), description="a lowercase hex sha256")]
AppPattern = Annotated[str, Meta(pattern=anchored(APP_PATTERN),
                                 description="an app name, or a glob of them ('*' and '?')")]
TokenId = Annotated[str, Meta(pattern=anchored(TOKEN_ID), description="a token's id")]
MinReplicas = Annotated[int, Meta(ge=0, le=MAX_REPLICAS)]
MaxReplicas = Annotated[int, Meta(ge=1, le=MAX_REPLICAS, description="at least min_replicas")]
Version = Annotated[int, Meta(ge=0, le=MAX_VERSION, description="0: the version before")]
