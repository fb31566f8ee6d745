"""Errors of the model backends; every one is an :class:`ember.EmberError`."""

from __future__ import annotations

import importlib
from types import ModuleType

from ember._errors import EmberError


class BackendError(EmberError):
    """A model backend (torch, ONNX Runtime, TensorRT) could not load or run a model."""


class BackendUnavailableError(BackendError, ImportError):
    """A backend's library, or the device it needs, is not available in this replica.

    Example:
        >>> try:
        ...     engine = ember.backends.tensorrt.Engine("model.plan")
        ... except ember.backends.BackendUnavailableError as exc:
        ...     print(exc)  # says what to install, or that the replica has no GPU
    """


class DeviceFallbackError(BackendError):
    """A session asked for a GPU silently ended up somewhere else (ONNX Runtime falls back to the CPU).

    Attributes:
        requested: the device asked for, e.g. ``"cuda:0"``.
        actual: where the session really runs, e.g. ``"cpu"``.
        providers: the session's execution providers, as ``get_providers()`` reports them.

    Example:
        >>> try:
        ...     sess = ember.backends.onnx.session("model.onnx", device="cuda:0")
        ... except ember.backends.DeviceFallbackError as exc:
        ...     print(exc.requested, exc.actual, exc.providers)  # cuda:0 cpu ['CPUExecutionProvider']
    """

    def __init__(self, message: str, *, requested: str, actual: str, providers: list[str]) -> None:
        super().__init__(message)
        self.requested = requested
        self.actual = actual
        self.providers = providers


def require(module: str, hint: str) -> ModuleType:
    """Import ``module`` (a backend library), or raise :class:`BackendUnavailableError` with ``hint``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise BackendUnavailableError(f"{module} is not installed in this environment: {hint}") from exc
