"""A schemathesis check of Ember's own (loaded with SCHEMATHESIS_HOOKS=support.contract_checks): every error answer
is in the one JSON shape, ``{"error": {...}}`` with exactly ERROR_KEYS, or the Open Inference Protocol's
``{"error": "<message>"}`` under ``/v2``, or OpenAI's under ``/openai``. schemathesis' own checks hold each answer
to its declared schema; this one also holds the answers no schema declares (a 405, a 404 of an unknown path)."""

from __future__ import annotations

import json
from typing import Any

import schemathesis

ERROR_KEYS = {"code", "message", "field", "type", "retry_after_s", "call_id"}
OPENAI_KEYS = {"message", "type", "param", "code"}  # OpenAI's errors, under /openai


def error_shape_problem(status: int, content_type: str, body: bytes, path: str) -> str | None:
    """Why an answer is no error in the shape, or None (2xx and 3xx answers have nothing to show)."""
    if status < 400:
        return None
    if not content_type.startswith("application/json"):
        return f"content-type {content_type!r}"
    try:
        parsed: Any = json.loads(body)
    except ValueError:
        return "not JSON"
    if path == "/v2" or path.startswith("/v2/"):
        ok = isinstance(parsed, dict) and set(parsed) == {"error"} and isinstance(parsed["error"], str)
        return None if ok else f"not the Open Inference Protocol's error shape: {str(parsed)[:200]}"
    if path.startswith("/openai/"):
        error = parsed.get("error") if isinstance(parsed, dict) else None
        ok = isinstance(error, dict) and set(parsed) == {"error"} and set(error) == OPENAI_KEYS \
            and isinstance(error["message"], str) and isinstance(error["type"], str)
        return None if ok else f"not OpenAI's error shape: {str(parsed)[:200]}"
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if not (isinstance(parsed, dict) and set(parsed) == {"error"} and isinstance(error, dict)
            and set(error) == ERROR_KEYS and isinstance(error["code"], str) and isinstance(error["message"], str)):
        return f"not the error shape: {str(parsed)[:200]}"
    return None


@schemathesis.check
def ember_error_shape(ctx: Any, response: Any, case: Any) -> bool | None:
    kind = response.headers.get("content-type") or [""]
    problem = error_shape_problem(response.status_code, kind[0] if isinstance(kind, list) else kind,
                                  response.content or b"", case.formatted_path)
    if problem:
        raise AssertionError(f"error answer {response.status_code}: {problem}")
    return None
