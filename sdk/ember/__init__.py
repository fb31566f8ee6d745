"""Ember: serverless functions for ML models on GPUs.

Example:
    >>> import ember
    >>> app = ember.App("hello")
    >>> @app.function()
    ... def greet(name: str) -> str:
    ...     return f"Hello, {name}!"

Deploy with ``ember push hello.py`` and call ``greet.remote("Ada")`` or ``POST /v1/hello/greet``;
queue a call with ``call = greet.spawn("Ada")`` and fetch its result with ``call.get()``.
"""

from ember import openai
from ember._app import App, method
from ember._deploy import deploy, promote, rollback
from ember._errors import (
    BadRequestError,
    CallCancelledError,
    CallCycleError,
    ConflictError,
    ConnectionError,
    DeadlineExceededError,
    EmberError,
    ForbiddenError,
    InvalidInputError,
    InvalidSpecError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    RateLimitedError,
    RemoteError,
    UnauthenticatedError,
    UnavailableError,
)
from ember._function_call import FunctionCall
from ember._handles import Function, FunctionHandle, MethodHandle, lookup
from ember._image import Image
from ember._inner import CallContext, current_call
from ember._llm import Sequence
from ember._schedule import Cron, Period
from ember._setup import health, setup, teardown
from ember._tensor import Tensor
from ember._version import __version__
from ember._volume import Volume, mounted
from ember.wire import Batch, Continuous, Retries

__all__ = [
    "App",
    "BadRequestError",
    "Batch",
    "CallCancelledError",
    "CallContext",
    "CallCycleError",
    "ConflictError",
    "ConnectionError",
    "Continuous",
    "Cron",
    "DeadlineExceededError",
    "EmberError",
    "ForbiddenError",
    "Function",
    "FunctionCall",
    "FunctionHandle",
    "Image",
    "InvalidInputError",
    "InvalidSpecError",
    "MethodHandle",
    "NotFoundError",
    "OverloadedError",
    "PayloadTooLargeError",
    "Period",
    "RateLimitedError",
    "RemoteError",
    "Retries",
    "Sequence",
    "Tensor",
    "UnauthenticatedError",
    "UnavailableError",
    "Volume",
    "__version__",
    "current_call",
    "deploy",
    "health",
    "lookup",
    "method",
    "mounted",
    "openai",
    "promote",
    "rollback",
    "setup",
    "teardown",
]
