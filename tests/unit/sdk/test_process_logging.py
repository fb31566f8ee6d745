"""Ember's own processes log text lines, or one JSON object per line for a collector."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from ember import _logging


def record(message: str, *args: object, exc: bool = False, **extra: object) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise ValueError("boom")
        except ValueError:
            exc_info = sys.exc_info()
    rec = logging.LogRecord("ember.test", logging.WARNING, __file__, 1, message, args, exc_info)
    rec.__dict__.update(extra)
    return rec


def test_a_json_record_is_one_line_with_the_fields_a_collector_reads() -> None:
    out = _logging.JsonFormatter("platform").format(record("replica %s lost", "r-1\nsecond line", node="n1"))
    assert "\n" not in out
    data = json.loads(out)
    assert data["message"] == "replica r-1\nsecond line lost" and data["level"] == "warning"
    assert data["process"] == "platform" and data["logger"] == "ember.test" and data["node"] == "n1"
    assert data["time"].endswith("+00:00") and isinstance(data["ts"], float)


def test_an_exception_is_kept_in_the_record() -> None:
    data = json.loads(_logging.JsonFormatter("agent").format(record("failed", exc=True)))
    assert "ValueError: boom" in data["exception"]


def test_extra_fields_cannot_overwrite_the_standard_ones() -> None:
    data = json.loads(_logging.JsonFormatter("agent").format(record("m", process_name="x", level_hint=3)))
    assert data["process"] == "agent" and data["level"] == "warning" and data["level_hint"] == 3


def test_the_format_comes_from_the_environment_and_a_bad_one_is_text(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_logging.FORMAT_ENV, "JSON")
    assert _logging.default_format() == "json"
    monkeypatch.setenv(_logging.FORMAT_ENV, "yaml")
    assert _logging.default_format() == "text"
    with pytest.raises(ValueError, match="log format"):
        _logging.configure("agent", "yaml")


@pytest.mark.parametrize("module", ["ember_platform", "ember_runtime"])
def test_the_processes_take_the_log_format_flag(module: str) -> None:
    out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=60)
    assert "--log-format {text,json}" in out.stdout
