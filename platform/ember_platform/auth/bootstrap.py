"""The control plane's first admin token: from ``--bootstrap-token-file``, or printed once at an installation's first
start; and the rule that a control plane checks tokens unless it listens on a loopback address only."""

from __future__ import annotations

import ipaddress
import os
import stat
from pathlib import Path

from ember.wire.tokens import new_token, parse_token
from ember_platform.auth.tokens import TokenStore


def read_token_file(path: Path) -> str:
    """The admin token held in ``path``; a new one is written there first (mode 0600) when the file does not exist.
    ``ValueError`` for a file that other users can read or that holds no token (its content is never shown)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        with os.fdopen(fd, "w") as fh:
            fh.write(new_token() + "\n")
    mode = path.stat().st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"{path} holds an admin token and other users can read it (mode {stat.S_IMODE(mode):04o}): "
                         f"chmod 600 {path}")
    token = path.read_text().strip()
    if parse_token(token) is None:
        raise ValueError(f"{path} does not hold an Ember token (ember_<id>_<secret>, on one line)")
    return token


def loopback_only(host: str) -> bool:
    """Whether ``host`` (what the control plane binds) is reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def first_token_banner(token: str) -> str:
    """What a control plane prints, once, when it created an installation's first admin token."""
    line = "=" * 78
    return (f"{line}\nEmber: this installation's first admin token (shown this once; it is stored only as a hash):\n\n"
            f"    {token}\n\nKeep it safe. `ember login` saves it; `ember token create` makes narrower ones.\n{line}")


async def bootstrap(store: TokenStore, token_file: str) -> str | None:
    """Start ``store`` and give the installation its admin token: the one in ``token_file`` (its record ensured),
    or, without a file, a new one when the bucket has never held a token; that new token is returned (to be
    printed, once), else None."""
    await store.start()
    if token_file:
        await store.ensure_admin(read_token_file(Path(token_file)), "bootstrap")
        return None
    return await store.first_admin() if store.enabled else None
