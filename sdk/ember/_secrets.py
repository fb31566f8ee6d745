"""Secrets through the platform's API (admin): set (with the app patterns that may use it), list (names, keys and
app patterns, never values), remove; and the CLI's
``KEY=VALUE`` spellings, with ``KEY=@path`` (a file's contents) and ``KEY=-`` (standard input) that keep a value
out of the command line."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import msgspec

from ember._client import Transport, default_transport
from ember._errors import InvalidInputError
from ember.wire import SecretRequest, SecretView, encoder

_JSON = {"content-type": "application/json"}


def parse_values(pairs: Iterable[str], read_stdin: Callable[[], str] | None = None) -> dict[str, str]:
    """``KEY=VALUE`` pairs as a dict; ``KEY=@path`` takes the file's contents, ``KEY=-`` standard input's (once);
    one trailing newline of either is dropped."""
    values: dict[str, str] = {}
    stdin_used = False
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise InvalidInputError(f"{key or pair!r}: write KEY=VALUE, KEY=@file or KEY=- (standard input)",
                                    field="KEY=VALUE")
        if value == "-":
            if stdin_used:
                raise InvalidInputError("only one KEY=- can read standard input", field=key)
            stdin_used = True
            value = _chomp((read_stdin or sys.stdin.read)())
        elif value.startswith("@"):
            try:
                value = _chomp(Path(value[1:]).expanduser().read_text())
            except OSError as exc:
                raise InvalidInputError(f"cannot read {value[1:]!r}: {exc.strerror}", field=key) from None
        values[key] = value
    return values


def _chomp(text: str) -> str:
    return text[:-1] if text.endswith("\n") else text


def set_secret(name: str, values: dict[str, str], apps: Sequence[str],
               transport: Transport | None = None) -> SecretView:
    """Set (create or replace) the secret ``name``: every key and value it holds, and the app names or patterns
    whose functions may declare it (``["team-b-*"]``; ``["*"]`` for every app).

    Example:
        ``set_secret("hf", {"HF_TOKEN": token}, apps=["chat-*"])``
    """
    body = SecretRequest(values=values, apps=list(apps))
    response = (transport or default_transport()).request(
        "PUT", f"/v1/secrets/{name}", content=encoder.encode(body), headers=_JSON)
    return msgspec.json.decode(response.content, type=SecretView)


def list_secrets(transport: Transport | None = None) -> list[SecretView]:
    """Every secret's name, keys, times and app patterns (never values)."""
    response = (transport or default_transport()).request("GET", "/v1/secrets")
    return msgspec.json.decode(response.content, type=list[SecretView])


def remove_secret(name: str, transport: Transport | None = None) -> None:
    (transport or default_transport()).request("DELETE", f"/v1/secrets/{name}")
