"""The key material of a deployment's NATS auth, and the ``authorization`` block of its servers' configuration.

An auth directory holds, each file mode 0600:

- ``platform.nk``: the control plane's own nkey seed (the only user the server knows; it bypasses the callout);
- ``callout.json``: the callout's signing key (whose public half the servers trust) and the secret that node
  credentials are derived from;
- ``auth.conf``: the block every nats-server of the deployment includes.

Nothing here is ever printed, logged or passed in argv.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import msgspec
import nkeys

from ember.wire import subjects
from ember.wire.natscreds import NatsCredentials, node_user, read_file, read_private, write_file, write_private
from ember_platform.natsauth.jwt import new_key

PLATFORM_SEED_FILE = "platform.nk"
CALLOUT_FILE = "callout.json"
SERVER_CONF_FILE = "auth.conf"


class _Callout(msgspec.Struct, frozen=True):
    issuer_seed: str
    secret: str


@dataclass(frozen=True, repr=False)
class AuthKeys:
    platform_seed: str
    issuer_seed: str
    secret: str

    def __repr__(self) -> str:
        return "AuthKeys(...)"

    @property
    def platform_public(self) -> str:
        return nkeys.from_seed(self.platform_seed.encode()).public_key.decode()

    @property
    def issuer(self) -> nkeys.KeyPair:
        return nkeys.from_seed(self.issuer_seed.encode())

    def platform_credentials(self) -> NatsCredentials:
        return NatsCredentials(nkey_seed=self.platform_seed)

    def node_password(self, node_id: str) -> str:
        subjects.check_token(node_id, "node id")
        return hmac.new(bytes.fromhex(self.secret), f"node:{node_id}".encode(), hashlib.sha256).hexdigest()

    def build_grant_key(self) -> bytes:
        """The key every control plane signs a build's bundle grant with (``control.node_reads.build_grant``)."""
        return hmac.new(bytes.fromhex(self.secret), b"build-grants", hashlib.sha256).digest()

    def node_credentials(self, node_id: str) -> NatsCredentials:
        return NatsCredentials(user=node_user(node_id), password=self.node_password(node_id),
                               inbox_prefix=node_inbox(node_id))

    def server_config(self) -> str:
        """The ``authorization`` block: the control plane is the one configured user, and it answers for the rest."""
        return (f"authorization {{\n"
                f"  timeout: 2\n"  # seconds a client waits for the callout's answer (no control plane: refused)
                f"  users: [ {{ nkey: {self.platform_public} }} ]\n"
                f"  auth_callout {{\n"
                f"    issuer: {self.issuer.public_key.decode()}\n"
                f"    auth_users: [ {self.platform_public} ]\n"
                f"  }}\n"
                f"}}\n")


def node_inbox(node_id: str) -> str:
    return f"_INBOX.node-{node_id}"


def generate() -> AuthKeys:
    return AuthKeys(platform_seed=new_key(nkeys.PREFIX_BYTE_USER).seed.decode(),
                    issuer_seed=new_key(nkeys.PREFIX_BYTE_ACCOUNT).seed.decode(), secret=secrets.token_hex(32))


def init(directory: Path) -> AuthKeys:
    """The keys in ``directory``, made (and the server block written) the first time."""
    if (directory / CALLOUT_FILE).exists():
        return load(directory)
    keys = generate()
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    write_file(directory / PLATFORM_SEED_FILE, keys.platform_credentials())
    write_private(directory / CALLOUT_FILE, msgspec.json.encode(_Callout(keys.issuer_seed, keys.secret)))
    write_private(directory / SERVER_CONF_FILE, keys.server_config().encode())
    return keys


def load(directory: Path) -> AuthKeys:
    platform = read_file(directory / PLATFORM_SEED_FILE)
    callout = msgspec.json.decode(read_private(directory / CALLOUT_FILE), type=_Callout)
    return AuthKeys(platform_seed=platform.nkey_seed, issuer_seed=callout.issuer_seed, secret=callout.secret)
