"""NATS JWTs, as nats-server reads them: signed with an nkey (ed25519), ``alg: ed25519-nkey``.

Only what the auth callout needs: decode the server's authorization request, and encode the user claims and
the authorization response that answer it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import time
from typing import Any

import nacl.exceptions
import nacl.signing
import nkeys

_HEADER = {"typ": "JWT", "alg": "ed25519-nkey"}


class JwtError(ValueError):
    """A JWT that is malformed or whose signature does not verify."""


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def encode(claims: dict[str, Any], signer: nkeys.KeyPair) -> str:
    """A JWT of ``claims`` issued and signed by ``signer`` (``iss``, ``iat`` and ``jti`` are filled in)."""
    body = {**claims, "iss": signer.public_key.decode(), "iat": int(time.time())}
    body.pop("jti", None)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).digest()
    body["jti"] = base64.b32encode(digest).decode().rstrip("=")
    signing_input = f"{_b64(json.dumps(_HEADER, separators=(',', ':')).encode())}." \
                    f"{_b64(json.dumps(body, separators=(',', ':')).encode())}"
    return f"{signing_input}.{_b64(signer.sign(signing_input.encode()))}"


def decode(token: str) -> dict[str, Any]:
    """The claims of a JWT whose signature verifies against its own issuer (``iss``), else ``JwtError``."""
    try:
        header_b64, body_b64, sig_b64 = token.split(".")
        header = json.loads(_unb64(header_b64))
        claims: dict[str, Any] = json.loads(_unb64(body_b64))
        if header.get("alg") != _HEADER["alg"]:
            raise JwtError(f"unexpected JWT algorithm {header.get('alg')!r}")
        verify_key(str(claims["iss"])).verify(f"{header_b64}.{body_b64}".encode(), _unb64(sig_b64))
    except JwtError:
        raise
    except (ValueError, KeyError, TypeError, nkeys.NkeysError, nacl.exceptions.CryptoError) as exc:
        raise JwtError(f"not a valid NATS JWT: {type(exc).__name__}") from exc
    return claims


def verify_key(public: str) -> nacl.signing.VerifyKey:
    """The ed25519 key of an nkey's public form (``N...``, ``A...``, ``U...``), its checksum checked."""
    raw = base64.b32decode(public + "=" * (-len(public) % 8))
    if len(raw) != 35 or nkeys.crc16(bytearray(raw[:-2])).to_bytes(2, "little") != raw[-2:]:
        raise JwtError("not an nkey public key")
    return nacl.signing.VerifyKey(raw[1:-2])


def new_key(prefix: int) -> nkeys.KeyPair:
    """A fresh nkey of one role (``nkeys.PREFIX_BYTE_ACCOUNT``, ``PREFIX_BYTE_USER``)."""
    return nkeys.from_seed(nkeys.encode_seed(os.urandom(32), prefix))
