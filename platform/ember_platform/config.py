from __future__ import annotations

import os
from dataclasses import dataclass, field

from ember.wire.natscreds import replica_ttl_s


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


@dataclass(frozen=True)
class Settings:
    """The control plane's settings; every one can be set from the environment."""

    nats_url: str = field(default_factory=lambda: os.environ.get("EMBER_NATS_URL", "nats://127.0.0.1:4222"))
    # The NATS auth keys (``python -m ember_platform.natsauth init``): the control plane connects with them and
    # answers the servers' auth callout. Empty: connect anonymously, to a server that allows it (tests of parts).
    nats_auth_dir: str = field(default_factory=lambda: os.environ.get("EMBER_NATS_AUTH_DIR", ""))
    max_body_bytes: int = field(default_factory=lambda: _env_int("EMBER_MAX_BODY_BYTES", 4 * 1024 * 1024))
    # The most a function's max_body_bytes= may ask for (and what one NATS message carries bounds it too).
    max_body_cap_bytes: int = field(default_factory=lambda: _env_int("EMBER_MAX_BODY_CAP_BYTES", 64 * 1024 * 1024))
    max_bundle_bytes: int = field(default_factory=lambda: _env_int("EMBER_MAX_BUNDLE_BYTES", 256 * 1024 * 1024))
    max_deploy_bytes: int = field(default_factory=lambda: _env_int("EMBER_MAX_DEPLOY_BYTES", 1024 * 1024))
    max_bundle_unpacked_bytes: int = field(
        default_factory=lambda: _env_int("EMBER_MAX_BUNDLE_UNPACKED_BYTES", 512 * 1024 * 1024))
    max_bundle_files: int = field(default_factory=lambda: _env_int("EMBER_MAX_BUNDLE_FILES", 10_000))
    # One chunk of a volume's file in one PUT (EMBER_MAX_VOLUME_CHUNK_BYTES); at most the client's 8 MiB pays off.
    max_volume_chunk_bytes: int = field(
        default_factory=lambda: _env_int("EMBER_MAX_VOLUME_CHUNK_BYTES", 8 * 1024 * 1024))
    max_volume_commit_bytes: int = field(
        default_factory=lambda: _env_int("EMBER_MAX_VOLUME_COMMIT_BYTES", 16 * 1024 * 1024))
    ack_wait_s: float = field(default_factory=lambda: float(os.environ.get("EMBER_ACK_WAIT_S", 30)))
    log_lines_kept: int = 2000
    auth: bool = True  # False (--insecure-no-auth, loopback addresses only): no route checks a token
    # An admin token's file (--bootstrap-token-file): its record is ensured at start; written first if missing.
    bootstrap_token_file: str = field(default_factory=lambda: os.environ.get("EMBER_BOOTSTRAP_TOKEN_FILE", ""))
    # The secrets key's file (--secrets-key-file, mode 0600, a Fernet key): without one, secrets are off (503).
    secrets_key_file: str = field(default_factory=lambda: os.environ.get("EMBER_SECRETS_KEY_FILE", ""))
    # How long a replica's NATS credentials are admitted after each connect (--replica-credentials-ttl, in s): the
    # JWT's ``exp``. Agents read the same EMBER_REPLICA_CREDENTIALS_TTL_S to tell their replicas when to renew.
    replica_credentials_ttl_s: float = field(default_factory=replica_ttl_s)
    # How long an unassigned replica's connections live on for its drain before they are kicked (in s).
    replica_drain_grace_s: float = field(default_factory=lambda: float(os.environ.get("EMBER_REPLICA_DRAIN_GRACE_S",
                                                                                       30)))
