"""NATS credentials: who a process is when it connects, and where it finds that.

Ember's NATS refuses anonymous clients. Each component connects as itself:

| who | user | password | kept in |
| --- | --- | --- | --- |
| the control plane | an nkey (``nkey_seed``) | - | ``<auth dir>/platform.nk`` (0600) |
| a node agent | ``node.<node id>`` | issued for that node | the ``--nats-creds`` file (0600) |
| a replica | ``replica.<node id>.<replica id>`` | derived by its agent | ``EMBER_NATS_CREDS``, removed at start |

The nats-server asks the control plane (its auth callout) about each node agent and replica, which answers with
the permissions of that one component (``ember_platform.natsauth``). Credentials never appear in argv.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import stat
from pathlib import Path
from typing import Any

import msgspec

CREDS_ENV = "EMBER_NATS_CREDS"  # a replica's credentials (JSON), set by its agent
CREDS_FILE_ENV = "EMBER_NATS_CREDS_FILE"  # a node agent's or a tool's credentials file
# How long a replica's credentials are admitted after each connect (the control plane's and the agents' setting).
REPLICA_TTL_ENV = "EMBER_REPLICA_CREDENTIALS_TTL_S"
REPLICA_TTL_S = 3600.0
NODE_USER_PREFIX = "node."
REPLICA_USER_PREFIX = "replica."


class CredentialsError(ValueError):
    """Credentials that cannot be read or used."""


class NatsCredentials(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """How one component authenticates to NATS: a user and password, or an nkey seed."""

    user: str = ""
    password: str = ""
    nkey_seed: str = ""
    inbox_prefix: str = ""  # where this component's own replies arrive (its permissions allow no other)
    ttl_s: float = 0.0  # the server ends a connection this long after it was admitted: renew before; 0: never

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect``."""
        options: dict[str, Any] = {}
        if self.nkey_seed:
            options["nkeys_seed_str"] = self.nkey_seed
        elif self.user:
            options["user"], options["password"] = self.user, self.password
        if self.inbox_prefix:
            options["inbox_prefix"] = self.inbox_prefix
        return options

    def __repr__(self) -> str:  # never shows a secret, wherever it is printed
        return f"NatsCredentials(user={self.user!r}, nkey={'yes' if self.nkey_seed else 'no'})"

    __str__ = __repr__

    def encode(self) -> bytes:
        return msgspec.json.encode(self)


def decode(data: bytes | str) -> NatsCredentials:
    try:
        return msgspec.json.decode(data, type=NatsCredentials)
    except msgspec.DecodeError as exc:
        raise CredentialsError(f"not NATS credentials: {exc}") from None


def read_private(path: Path) -> bytes:
    """A file that only its owner may read (like an ssh key: one others can read is refused)."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise CredentialsError(f"cannot read {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CredentialsError(f"{path} may be read by others (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    return data


def write_private(path: Path, data: bytes) -> Path:
    """Write ``path`` with mode 0600 (created so: never readable by others for an instant)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    tmp.replace(path)
    return path


def read_file(path: Path) -> NatsCredentials:
    """NATS credentials from a file only its owner may read."""
    return decode(read_private(path))


def write_file(path: Path, creds: NatsCredentials) -> Path:
    return write_private(path, creds.encode())


def take_from_env() -> NatsCredentials | None:
    """A replica's credentials from ``EMBER_NATS_CREDS``, removed from the environment so that nothing the
    replica starts (or the user's code) finds them there."""
    raw = os.environ.pop(CREDS_ENV, None)
    return decode(raw) if raw else None


def node_user(node_id: str) -> str:
    return f"{NODE_USER_PREFIX}{node_id}"


def replica_user(node_id: str, replica_id: str) -> str:
    return f"{REPLICA_USER_PREFIX}{node_id}.{replica_id}"


def replica_inbox(replica_id: str) -> str:
    """The inbox prefix of a replica: its permissions let it receive replies there and nowhere else."""
    return f"_INBOX.{replica_id}"


def replica_password(node_password: str, replica_id: str) -> str:
    """A replica's password, derived by its node's agent from the node's own: the auth callout derives the same
    after checking that the replica is assigned to that node, so an agent speaks only for its own replicas."""
    return hmac.new(node_password.encode(), f"replica:{replica_id}".encode(), hashlib.sha256).hexdigest()


def replica_credentials(node: NatsCredentials, replica_id: str) -> NatsCredentials:
    """A replica's credentials, made by the agent of its node from the node's own; they expire ``ttl_s`` after each
    connect (``replica_ttl_s``), so the replica renews them by reconnecting (``ember_runtime.replica.renewal``)."""
    node_id = node.user[len(NODE_USER_PREFIX):]
    return NatsCredentials(user=replica_user(node_id, replica_id), password=replica_password(node.password, replica_id),
                           inbox_prefix=replica_inbox(replica_id), ttl_s=replica_ttl_s())


def replica_ttl_s() -> float:
    """How long the auth callout admits a replica after each connect (``EMBER_REPLICA_CREDENTIALS_TTL_S``, one hour
    by default): the control plane puts it in the replica's JWT (``exp``), the agent tells the replica, which
    reconnects at half of it. Both must be given the same value."""
    raw = os.environ.get(REPLICA_TTL_ENV, "").strip()
    try:
        ttl = float(raw) if raw else REPLICA_TTL_S
    except ValueError:
        raise ValueError(f"{REPLICA_TTL_ENV}={raw!r} is not a number of seconds") from None
    if not 1.0 <= ttl <= 30 * 86400:
        raise ValueError(f"{REPLICA_TTL_ENV}={raw!r} is not between 1 s and 30 days")
    return ttl
