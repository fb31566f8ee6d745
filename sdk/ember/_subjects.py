"""Subject grants through the platform's API (admin): which apps may bind subjects beyond their own
``events.<app>.>``."""

from __future__ import annotations

import msgspec

from ember._client import Transport, default_transport
from ember.wire import encoder
from ember.wire.grants import SubjectGrant, SubjectGrantRequest

_JSON = {"content-type": "application/json"}


def grant_subject(pattern: str, apps: list[str], transport: Transport | None = None) -> SubjectGrant:
    """Let the apps matching ``apps`` bind subjects inside ``pattern`` (``'orders.>'``) from their next push."""
    response = (transport or default_transport()).request(
        "POST", "/v1/subjects/grant", content=encoder.encode(SubjectGrantRequest(pattern=pattern, apps=apps)),
        headers=_JSON)
    return msgspec.json.decode(response.content, type=SubjectGrant)


def revoke_subject(pattern: str, apps: list[str] | None = None,
                   transport: Transport | None = None) -> SubjectGrant | None:
    """Take ``pattern`` back from ``apps`` (None: from every app); what is left of the grant, None for nothing."""
    response = (transport or default_transport()).request(
        "POST", "/v1/subjects/revoke", content=encoder.encode(SubjectGrantRequest(pattern=pattern, apps=apps or [])),
        headers=_JSON)
    return msgspec.json.decode(response.content, type=SubjectGrant | None)


def list_subject_grants(transport: Transport | None = None) -> list[SubjectGrant]:
    response = (transport or default_transport()).request("GET", "/v1/subjects")
    return msgspec.json.decode(response.content, type=list[SubjectGrant])
