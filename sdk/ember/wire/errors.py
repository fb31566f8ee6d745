"""An ``EmberError`` and its wire form (``ErrorInfo``), both ways: the one conversion every side uses."""

from __future__ import annotations

from ember._errors import EmberError, error_class
from ember.wire.calls import ErrorInfo


def error_info(error: EmberError, call_id: str | None = None) -> ErrorInfo:
    """The wire form of ``error``; ``call_id``, when given, names the call it answers."""
    return ErrorInfo(code=error.code, message=error.message, field=error.field, type=error.remote_type,
                     retry_after_s=error.retry_after_s, call_id=call_id or error.call_id)


def error_from_info(info: ErrorInfo) -> EmberError:
    """The ``EmberError`` subclass a wire error stands for, with its details."""
    return error_class(info.code)(info.message, field=info.field, retry_after_s=info.retry_after_s,
                                  remote_type=info.type, call_id=info.call_id)
