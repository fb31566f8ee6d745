"""The replica's device: ``"cpu"`` or ``"cuda:N"``, as the node agent assigns it in ``EMBER_DEVICE``."""

from __future__ import annotations

import functools
import os
import re

from ember._errors import InvalidSpecError

ENV_VAR = "EMBER_DEVICE"
MEMORY_ENV_VAR = "EMBER_GPU_MEMORY_MB"
_DEVICE = re.compile(r"cpu|cuda(?::(\d{1,3}))?")


def device() -> str:
    """The device this replica was given: ``"cpu"`` or ``"cuda:N"`` (from ``EMBER_DEVICE``, default ``"cpu"``).

    Backends place models here unless told otherwise. ``"cuda"`` is read as ``"cuda:0"``.

    Example:
        >>> ember.backends.device()
        'cuda:0'
    """
    return resolve(os.environ.get(ENV_VAR, "").strip() or "cpu", source=ENV_VAR)


def memory_budget_mb() -> int:
    """The GPU memory this replica reserved (MB), when it shares its GPU with others by memory; 0: whole GPU.

    ``ember.backends.torch.load_module`` caps torch's allocator at this share of the GPU.
    """
    raw = os.environ.get(MEMORY_ENV_VAR, "").strip()
    if not raw:
        return 0
    if not raw.isdigit():
        raise InvalidSpecError(f"{MEMORY_ENV_VAR}={raw!r}: a number of megabytes")
    return int(raw)


def resolve(name: str | None, *, source: str = "device") -> str:
    """``name`` checked and normalised, or the replica's device when ``name`` is ``None``."""
    if name is not None and not isinstance(name, str):
        raise InvalidSpecError(f"{source}={name!r}: a device is 'cpu' or 'cuda:N' (e.g. 'cuda:0')")
    return device() if name is None else _resolve(name, source)


@functools.lru_cache(maxsize=64)
def _resolve(name: str, source: str) -> str:
    match = _DEVICE.fullmatch(name.strip().lower())
    if match is None:
        raise InvalidSpecError(f"{source}={name!r}: a device is 'cpu' or 'cuda:N' (e.g. 'cuda:0')")
    return "cpu" if match.group(0) == "cpu" else f"cuda:{int(match.group(1) or 0)}"


def cuda_index(name: str) -> int | None:
    """The GPU index of a resolved device name, ``None`` for the CPU."""
    return None if name == "cpu" else int(name.partition(":")[2])
