"""The control plane's secrets key: a Fernet key in a file only its owner may read (``--secrets-key-file``)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from cryptography.fernet import Fernet

KEY_SETTING = "--secrets-key-file / EMBER_SECRETS_KEY_FILE"


class SecretsKeyError(ValueError):
    """The key file cannot be used (missing, readable by others, not a Fernet key)."""


def read_key(path: Path) -> Fernet:
    """The Fernet of the key in ``path``; refused if others may read it (like an ssh key)."""
    try:
        mode = path.stat().st_mode
        data = path.read_bytes().strip()
    except OSError as exc:
        raise SecretsKeyError(f"cannot read the secrets key from {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SecretsKeyError(f"the secrets key {path} may be read by others (mode {stat.S_IMODE(mode):o}); "
                              "chmod 600 it")
    try:
        return Fernet(data)
    except ValueError:
        raise SecretsKeyError(f"{path} holds no Fernet key (32 url-safe base64-encoded bytes; "
                              "`python -m ember_platform.secrets.key PATH` writes one)") from None


def write_key(path: Path) -> Path:
    """Write a new key to ``path`` (mode 0600 from the start) unless one is there; ``path``."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(Fernet.generate_key() + b"\n")
    tmp.replace(path)
    return path


if __name__ == "__main__":
    import sys

    print(write_key(Path(sys.argv[1])))
