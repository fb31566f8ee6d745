"""Tokens through the platform's API: create (admin), list (admin), revoke (admin), and what a token may do."""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ember._client import Transport, default_transport
from ember.wire import NewToken, TokenInfo, TokenRequest, encoder

_JSON = {"content-type": "application/json"}


def create_token(scopes: Sequence[str], apps: Sequence[str] = ("*",), *, name: str = "", ttl: str | None = None,
                 transport: Transport | None = None) -> NewToken:
    """A new token with ``scopes`` on ``apps`` (names or globs), living ``ttl`` (``30d``, ``12h``...) or until
    revoked. The answer holds the token itself: it is never shown again."""
    body = encoder.encode(TokenRequest(scopes=list(scopes), apps=list(apps), name=name,  # type: ignore[arg-type]
                                       ttl=ttl))  # scopes: the platform names an unknown one
    response = (transport or default_transport()).request("POST", "/v1/tokens", content=body, headers=_JSON)
    return msgspec.json.decode(response.content, type=NewToken)


def list_tokens(transport: Transport | None = None) -> list[TokenInfo]:
    """Every live token's record (never a secret)."""
    response = (transport or default_transport()).request("GET", "/v1/tokens")
    return msgspec.json.decode(response.content, type=list[TokenInfo])


def revoke_token(token_id: str, transport: Transport | None = None) -> TokenInfo:
    """Revoke the token ``token_id``: it fails at its next request."""
    response = (transport or default_transport()).request("DELETE", f"/v1/tokens/{token_id}")
    return msgspec.json.decode(response.content, type=TokenInfo)


def own_token(transport: Transport | None = None) -> TokenInfo:
    """The record of the token the transport sends: ``UnauthenticatedError`` when the platform refuses it."""
    response = (transport or default_transport()).request("GET", "/v1/tokens/self")
    return msgspec.json.decode(response.content, type=TokenInfo)
