"""How Ember's own processes (control plane, node agent) write their logs: a text line for a terminal, or one JSON
object per line for a log collector (``--log-format json`` or ``EMBER_LOG_FORMAT=json``).

A JSON record has ``ts`` (seconds since the epoch), ``time`` (ISO 8601, UTC), ``level``, ``process`` (``platform``
or ``agent``), ``logger``, ``message``, and ``exception`` when one was logged; any ``extra={...}`` fields whose names
do not clash with these are added as they are.
"""

from __future__ import annotations

import datetime
import logging
import os
from typing import Any

import msgspec

FORMATS = ("text", "json")
FORMAT_ENV = "EMBER_LOG_FORMAT"
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def __init__(self, process: str) -> None:
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 6),
            "time": datetime.datetime.fromtimestamp(record.created, datetime.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "process": self.process,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        for key, value in vars(record).items():
            if key not in _STANDARD and key not in out and not key.startswith("_"):
                out[key] = value
        return msgspec.json.encode(out, enc_hook=str).decode()


def default_format() -> str:
    value = os.environ.get(FORMAT_ENV, "text").strip().lower()
    return value if value in FORMATS else "text"


def configure(process: str, fmt: str | None = None, level: int = logging.INFO) -> None:
    """Send the process's logs to stderr as ``fmt`` (default: ``$EMBER_LOG_FORMAT``, else text)."""
    fmt = fmt or default_format()
    if fmt not in FORMATS:
        raise ValueError(f"log format {fmt!r}: one of {', '.join(FORMATS)}")
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter(process))
    else:
        handler.setFormatter(logging.Formatter(f"%(asctime)s {process} %(levelname)s %(message)s"))
    logging.basicConfig(level=level, handlers=[handler], force=True)
