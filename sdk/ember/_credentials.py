"""Where the SDK finds the platform and its token: ``EMBER_URL`` and ``EMBER_TOKEN``, else the file ``ember login``
writes (``$XDG_CONFIG_HOME/ember/credentials``, by default ``~/.config/ember/credentials``, mode 0600).

The saved token is sent only to the URL it was saved for, so that pointing ``EMBER_URL`` elsewhere never hands it
to another server. A credentials file that other users can read is refused, not read.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import msgspec

from ember._errors import UnauthenticatedError

DEFAULT_URL = "http://127.0.0.1:8700"


class Credentials(msgspec.Struct, frozen=True, kw_only=True):
    url: str
    token: str


_kept: tuple[tuple[str, int, int], Credentials | None] | None = None  # (path, mtime, size) -> what it held


def credentials_path() -> Path:
    """The credentials file: ``$XDG_CONFIG_HOME/ember/credentials``, or ``~/.config/ember/credentials``."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "ember" / "credentials"


def load_credentials(path: Path | None = None) -> Credentials | None:
    """What ``ember login`` saved, or None when nothing was; ``UnauthenticatedError`` for a file that other users
    can read (it is not read) or that is not a credentials file."""
    global _kept
    path = path or credentials_path()
    try:
        info = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UnauthenticatedError(f"{path} holds a token and other users can read it (mode "
                                   f"{stat.S_IMODE(info.st_mode):04o}); it was not read: chmod 600 {path}")
    key = (str(path), info.st_mtime_ns, info.st_size)
    if _kept is not None and _kept[0] == key:
        return _kept[1]
    try:
        found = msgspec.json.decode(path.read_bytes(), type=Credentials)
    except (OSError, msgspec.MsgspecError) as exc:
        raise UnauthenticatedError(f"{path} is not an Ember credentials file ({exc}); run `ember login` again") \
            from exc
    _kept = (key, found)
    return found


def save_credentials(url: str, token: str, path: Path | None = None) -> Path:
    """Save ``url`` and ``token`` for the SDK and the CLI (mode 0600, in a folder of mode 0700); the file saved."""
    path = path or credentials_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(msgspec.json.encode(Credentials(url=url.rstrip("/"), token=token)) + b"\n")
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to a file that was there already
    tmp.replace(path)
    return path


def platform_url() -> str:
    """The platform's base URL: ``EMBER_URL``, else the one ``ember login`` saved, else the local development
    platform."""
    url = os.environ.get("EMBER_URL")
    if not url:
        saved = load_credentials()
        url = saved.url if saved is not None else DEFAULT_URL
    return url.rstrip("/")


def platform_token(url: str) -> str | None:
    """The token to send to ``url``: ``EMBER_TOKEN``, else the one ``ember login`` saved for that URL."""
    token = os.environ.get("EMBER_TOKEN", "").strip()
    if token:
        return token
    saved = load_credentials()
    return saved.token if saved is not None and saved.url == url.rstrip("/") else None
