"""A class model's hooks: ``@ember.setup`` (prepare the instance), ``@ember.teardown`` (release what it holds when
its replica stops) and ``@ember.health`` (whether its replica is fit to serve), and running them in order.

Its own module so that both the decorators (``_app``) and the handles' ``.local()`` (``_handles``) use it
without importing each other.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ember._errors import InvalidSpecError

SETUP_MARK = "__ember_setup__"
TEARDOWN_MARK = "__ember_teardown__"
HEALTH_MARK = "__ember_health__"  # (every_s, timeout_s, failures)
MAX_HEALTH_S = 3600.0
MAX_HEALTH_FAILURES = 100


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
        _check_hook("setup", raw)
        if getattr(raw, TEARDOWN_MARK, False) or getattr(raw, HEALTH_MARK, None) is not None:
            raise InvalidSpecError(f"{raw.__qualname__}() is marked @ember.setup and another hook")
        setattr(raw, SETUP_MARK, "snap" if snap else "replica")
        return raw

    return decorate(fn) if fn is not None else decorate


def teardown(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a method of an ``@app.model`` class to run once when its replica stops, after the replica has finished
    the calls it held: a scale-down, a new version replacing it, ``ember delete``, its node's agent stopping it.

    It runs on the thread that ran the setup and the calls, within the replica's stop grace (the node agent's
    ``--stop-grace-s``, 25 s by default; past it the replica is killed). Release what setup acquired there: close
    a connection, flush a buffer, stop an engine's processes. It does not run when the replica is killed (by a
    signal it cannot catch, or for memory), nor when its setup did not finish. An exception is printed to the
    replica's stderr (``ember logs``) and the replica's other teardown methods still run; a subclass's run before
    its bases', each class's in the order it defines them.

    Example:
        >>> @app.model()
        ... class Ranker:
        ...     @ember.setup
        ...     def connect(self): self.db = connect_db()
        ...     @ember.teardown
        ...     def close(self): self.db.close()
    """
    _check_hook("teardown", fn)
    if getattr(fn, SETUP_MARK, None) is not None or getattr(fn, HEALTH_MARK, None) is not None:
        raise InvalidSpecError(f"{fn.__qualname__}() is marked @ember.teardown and another hook")
    setattr(fn, TEARDOWN_MARK, True)
    return fn


def health(fn: Any = None, /, *, every_s: float = 10.0, timeout_s: float = 30.0, failures: int = 3) -> Any:
    """Mark the method of an ``@app.model`` class that says whether its replica is healthy (Ray Serve's
    ``check_health``): it runs every ``every_s`` seconds while the replica serves, each time on a thread of its own
    (a long batch on the model thread does not hold it up, so read the model's state with that in mind).

    A check fails when it raises, returns ``False`` or runs longer than ``timeout_s``; each failure is said on the
    replica's stderr. After ``failures`` failed checks in a row (3, as Ray Serve and Kubernetes' probes count them: a
    passing check starts the count again, so a blip does not cost a replica) the replica gives way: it takes no more
    calls, hands back those not begun (their callers retry elsewhere at once), says why on its stderr (``ember
    logs``; ``ember status`` tells of it for an hour), and is replaced, a new replica first; then it finishes the
    calls it runs and stops, running its ``@ember.teardown`` methods. Check what calls cannot see for themselves: a
    device in an error state, a lost connection, an engine's dead worker process. One per class.

    Example:
        >>> @app.model(gpu=1)
        ... class Generator:
        ...     @ember.health(every_s=5)
        ...     def engine_alive(self) -> bool: return self.engine.is_running()
    """
    for name, value in (("every_s", every_s), ("timeout_s", timeout_s)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0.1 <= value <= MAX_HEALTH_S:
            raise InvalidSpecError(f"@ember.health({name}={value!r}): seconds from 0.1 to {MAX_HEALTH_S:g}")
    if isinstance(failures, bool) or not isinstance(failures, int) or not 1 <= failures <= MAX_HEALTH_FAILURES:
        raise InvalidSpecError(f"@ember.health(failures={failures!r}): failed checks in a row before the replica "
                               f"gives way, a whole number from 1 to {MAX_HEALTH_FAILURES}")

    def decorate(raw: Callable[..., Any]) -> Callable[..., Any]:
        _check_hook("health", raw)
        if getattr(raw, SETUP_MARK, None) is not None or getattr(raw, TEARDOWN_MARK, False):
            raise InvalidSpecError(f"{raw.__qualname__}() is marked @ember.health and another hook")
        setattr(raw, HEALTH_MARK, (float(every_s), float(timeout_s), failures))
        return raw

    return decorate(fn) if fn is not None else decorate


def health_check(cls: type) -> tuple[str, float, float, int] | None:
    """The name, period, timeout and failures in a row of ``cls``'s ``@ember.health`` method; None without one;
    ``InvalidSpecError`` for two."""
    found = [(name, *getattr(member, HEALTH_MARK)) for name, member in members(cls)
             if getattr(member, HEALTH_MARK, None) is not None]
    if len(found) > 1:
        raise InvalidSpecError(f"class {cls.__name__} has {len(found)} @ember.health methods "
                               f"({', '.join(name for name, *_ in found)}): one says whether a replica is healthy")
    return found[0] if found else None


def check_not_hook(where: str, raw: Any) -> None:
    """``InvalidSpecError`` when ``raw``, about to be served by ``where``, is marked as a class model's hook."""
    marks = [("setup", getattr(raw, SETUP_MARK, None) is not None), ("teardown", getattr(raw, TEARDOWN_MARK, False)),
             ("health", getattr(raw, HEALTH_MARK, None) is not None)]
    for kind, marked in marks:
        if marked:
            raise InvalidSpecError(f"{where} on {raw.__qualname__}(): it is marked @ember.{kind}, a hook that the "
                                   "replica runs itself, not a function it serves")


def _check_hook(kind: str, raw: Any) -> None:
    if not inspect.isfunction(raw):
        raise InvalidSpecError(f"@ember.{kind} decorates a method, not {raw!r}")
    if inspect.iscoroutinefunction(raw) or inspect.isasyncgenfunction(raw) or inspect.isgeneratorfunction(raw):
        raise InvalidSpecError(f"@ember.{kind} {raw.__qualname__}() is a plain method (`def`, not `async def` nor a "
                               "generator): the replica runs it on a thread")
    if len(inspect.signature(raw).parameters) != 1:
        raise InvalidSpecError(f"@ember.{kind} {raw.__qualname__}() takes only `self`")


def run_setup(instance: Any, *, snap: bool | None = None) -> None:
    """Run an instance's ``@ember.setup`` methods, base classes first: the snap ones (``snap=True``), the
    per-replica ones (``snap=False``) or all of them, snap ones first (``None``)."""
    phases = ["snap", "replica"] if snap is None else ["snap" if snap else "replica"]
    for phase in phases:
        for _, member in members(type(instance)):
            if getattr(member, SETUP_MARK, None) == phase:
                member(instance)


def run_teardown(instance: Any) -> list[tuple[str, Exception]]:
    """Run an instance's ``@ember.teardown`` methods, a subclass's before its bases' (the reverse of setup), each
    class's in the order it defines them, each whatever the ones before it raised; the methods that raised, by
    name, with what they raised."""
    failed, seen = [], set()
    for klass in type(instance).__mro__:  # the class's own methods in their order, then its bases'
        for name, member in vars(klass).items():
            if name in seen:
                continue  # overridden by a subclass: the subclass's counts
            seen.add(name)
            if getattr(member, TEARDOWN_MARK, False):
                try:
                    member(instance)
                except Exception as exc:
                    failed.append((name, exc))
    return failed


def has_snap_setup(cls: type) -> bool:
    return any(getattr(member, SETUP_MARK, None) == "snap" for _, member in members(cls))


def members(cls: type) -> list[tuple[str, Any]]:
    """Every attribute of ``cls`` and its bases, a subclass's winning, base classes' first."""
    seen: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        seen.update(vars(klass))
    return list(seen.items())
