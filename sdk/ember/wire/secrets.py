"""Secrets: named sets of environment variables a service declares (``secrets=["hf"]``), the bodies of
``/v1/secrets`` and the node agent's request for a replica's secrets.

A secret is kept in the ``ember_secrets`` bucket under its name, its values encrypted under the control plane's
key (only the control plane reads the bucket). Names and keys are not secret; values never leave the control plane
except in the answer to the node agent that starts a replica declaring them. Each secret has owners: the app
patterns (``team-b-*``, ``'*'`` for every app) whose apps may declare it; one stored before secrets had them (no
``apps``) serves no app until it is set again.
"""

from __future__ import annotations

import re
from typing import Annotated

import msgspec
from msgspec import Meta

from ember.wire.bounds import AppPattern, anchored

SECRET_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
SECRET_KEY = re.compile(r"[A-Z_][A-Z0-9_]{0,127}")
MAX_SECRET_KEYS = 64
MAX_SECRET_BYTES = 32 * 1024  # keys and values of one secret together, as UTF-8
MAX_SECRETS_PER_SERVICE = 16
# What Ember, Python, the loader or CUDA read from a replica's environment: a secret may not set it.
RESERVED_KEYS = frozenset({"PATH", "HOME", "TMPDIR", "USER", "SHELL", "PWD", "CUDA_VISIBLE_DEVICES",
                           "NVIDIA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS"})
RESERVED_PREFIXES = ("EMBER_", "PYTHON", "LD_", "NATS_", "BWRAP")
MAX_SECRET_APPS = 100
# key_problem's rule as a pattern: an environment variable name that is neither reserved nor under a reserved prefix
SECRET_KEY_PATTERN = anchored(
    f"(?!(?:{'|'.join(RESERVED_PREFIXES)}))(?!(?:{'|'.join(sorted(RESERVED_KEYS))})$){SECRET_KEY.pattern}")
# Not a constraint msgspec checks: key_problem does, with a message that names the key and why (a reserved one).
SecretKey = Annotated[str, Meta(description=f"an environment variable name, not one Ember sets: {SECRET_KEY_PATTERN}")]
SecretValue = Annotated[str, Meta(pattern="^[^\\x00]*$", description="any text but NUL")]


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a secret, or None."""
    if SECRET_NAME.fullmatch(name):
        return None
    shown = name if len(name) <= 80 else name[:80] + "..."
    return f"secret name {shown!r}: 1 to 63 lowercase letters, digits and '-', starting with a letter or digit"


def key_problem(key: str) -> str | None:
    """Why ``key`` cannot be one of a secret's environment variables, or None."""
    shown = key if len(key) <= 80 else key[:80] + "..."
    if not SECRET_KEY.fullmatch(key):
        return f"key {shown!r}: an environment variable name, [A-Z_][A-Z0-9_]{{0,127}}"
    if key in RESERVED_KEYS or key.startswith(RESERVED_PREFIXES):
        return (f"key {shown!r} is set by Ember for every replica; a secret may not set it (nor any "
                f"{', '.join(p + '*' for p in RESERVED_PREFIXES)}, {', '.join(sorted(RESERVED_KEYS))})")
    return None


class SecretRequest(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``PUT /v1/secrets/<name>`` (``ember secret set``): every key and value of the secret (it replaces), and the
    app patterns whose apps may use it. ``apps`` is required (None is refused naming it): no secret is every
    app's by default."""

    values: Annotated[dict[SecretKey, SecretValue], Meta(min_length=1, max_length=MAX_SECRET_KEYS)]
    apps: Annotated[list[AppPattern], Meta(min_length=1, max_length=MAX_SECRET_APPS)]


class StoredSecret(msgspec.Struct, frozen=True, kw_only=True):
    """A secret as the ``ember_secrets`` bucket keeps it: its values a Fernet token of their JSON."""

    name: str
    keys: list[str]
    ciphertext: str
    created_at: float = 0.0
    updated_at: float = 0.0
    updated_by: str = ""  # the id of the token that set it
    apps: list[str] = []  # the app patterns that may use it; none (a record from before they existed): no app


class SecretView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/secrets`` and ``PUT``'s answer: a secret's name, keys, times and app patterns, never its values."""

    name: str
    keys: list[str]
    created_at: float = 0.0
    updated_at: float = 0.0
    apps: list[str] = []


class SecretsRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A node agent asks for the secrets of a replica assigned to it (on ``subjects.node_secrets``)."""

    replica_id: str


class SecretsAnswer(msgspec.Struct, frozen=True, kw_only=True):
    """The replica's secrets as environment variables, or why not (``error``)."""

    env: dict[str, str] = {}
    error: str = ""
