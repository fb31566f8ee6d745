"""``@ember.setup``: the methods that prepare a class model's instance, and running them in order.

Its own module so that both the decorators (``_app``) and the handles' ``.local()`` (``_handles``) use it
without importing each other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ember._errors import InvalidSpecError

SETUP_MARK = "__ember_setup__"


def setup(fn: Any = None, /, *, snap: bool = False) -> Any:
    """Mark a method of an ``@app.model`` class to run once per replica, before it serves calls.

    With ``snap=True`` the method runs once per node and function version instead, in a *zygote* process
    that the node keeps preloaded; each replica is then forked from the zygote, already holding what the
    method built, and runs only the plain ``@ember.setup`` methods. A snap method must not touch the GPU
    (no CUDA context survives a fork) nor start threads or connections: import, build the model and load its
    weights into host memory there, and move them to the replica's device in a plain ``@ember.setup``. A
    class with only plain setup methods works the same, without the faster start.

    Example:
        >>> @app.model(gpu=1)
        ... class Classifier:
        ...     @ember.setup(snap=True)
        ...     def load(self): self.net = load_weights(device="cpu")
        ...     @ember.setup
        ...     def to_gpu(self): self.net = self.net.to(ember.backends.device())
    """
    def decorate(raw: Callable[..., Any]) -> Callable[..., Any]:
        if not inspect.isfunction(raw):
            raise InvalidSpecError(f"@ember.setup decorates a method, not {raw!r}")
        if len(inspect.signature(raw).parameters) != 1:
            raise InvalidSpecError(f"@ember.setup {raw.__qualname__}() takes only `self`")
        setattr(raw, SETUP_MARK, "snap" if snap else "replica")
        return raw

    return decorate(fn) if fn is not None else decorate


def run_setup(instance: Any, *, snap: bool | None = None) -> None:
    """Run an instance's ``@ember.setup`` methods, base classes first: the snap ones (``snap=True``), the
    per-replica ones (``snap=False``) or all of them, snap ones first (``None``)."""
    phases = ["snap", "replica"] if snap is None else ["snap" if snap else "replica"]
    for phase in phases:
        for _, member in members(type(instance)):
            if getattr(member, SETUP_MARK, None) == phase:
                member(instance)


def has_snap_setup(cls: type) -> bool:
    return any(getattr(member, SETUP_MARK, None) == "snap" for _, member in members(cls))


def members(cls: type) -> list[tuple[str, Any]]:
    """Every attribute of ``cls`` and its bases, a subclass's winning, base classes' first."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        seen.update(vars(klass))
    return list(seen.items())
