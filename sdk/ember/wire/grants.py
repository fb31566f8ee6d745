"""Subject grants: the NATS subject patterns an admin lets apps bind beyond their own ``events.<app>.>``, and the
bodies of ``/v1/subjects``.

A grant is kept in the ``ember_subject_grants`` bucket (the control plane's alone) under the sha256 of its pattern
(a pattern's ``*`` and ``>`` cannot be part of a key), and mirrored in memory by every control plane.
"""

from __future__ import annotations

import hashlib
from typing import Annotated

import msgspec
from msgspec import Meta

from ember.wire.bounds import AppPattern, anchored

MAX_SUBJECT_LENGTH = 256
MAX_GRANT_APPS = 100
# A pattern whose first token is neither a wildcard nor a root of Ember's (ember, _EMBER, _INBOX) or the server's
# ('$...': its tokens cannot hold '$'): the same rule as validate.subject_problem(wildcards=True).
GRANT_PATTERN = (r"(?!(?:ember|_EMBER|_INBOX)(?:\.|$))[A-Za-z0-9_-]+(?:\.(?:[A-Za-z0-9_-]+|\*))*(?:\.>)?")


class SubjectGrantRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/subjects/grant`` (``ember subject grant``): ``apps`` (app names or globs, as a token's app
    patterns) may bind subjects inside ``pattern`` from now on. ``POST /v1/subjects/revoke``: those apps (none: all
    of them) no longer may, at their next push."""

    pattern: Annotated[str, Meta(pattern=anchored(GRANT_PATTERN), max_length=MAX_SUBJECT_LENGTH,
                                 description="a NATS subject pattern ('*' a token, a final '>' the rest), outside "
                                             "Ember's and the server's own roots")]
    apps: Annotated[list[AppPattern], Meta(max_length=MAX_GRANT_APPS)] = []


class SubjectGrant(msgspec.Struct, frozen=True, kw_only=True):
    """A grant as the bucket keeps it: the pattern, the app patterns it is granted to, and who changed it last."""

    pattern: str
    apps: list[str]
    updated_at: float = 0.0
    updated_by: str = ""  # the id of the token that changed it last


def grant_key(pattern: str) -> str:
    """The bucket's key of the grant of ``pattern``."""
    return hashlib.sha256(pattern.encode()).hexdigest()
