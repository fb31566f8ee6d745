"""What a change of an app's deployment does to its queues in ``EMBER_CALLS``, after the registry wrote it.

- **A function's own queue** (its unpinned calls) is pulled by the replicas of the versions that run: the one rolled
  out and those in the traffic (``Deployment.running``). So a function stays while one of them has it: a push without
  it changes nothing until the new version takes the traffic (the version it replaces serves the function until
  then), nor does a canary without it while its stable version serves. Once none has it (that push switched, the
  canary was promoted, a rollback went to a version without it), the function is *retired*: its consumer (and event
  stream) deleted, and each call waiting in its queue finished as ``cancelled``, saying in which version the function
  was removed, its message deleted. A version kept only for ``ember rollback`` runs no replica, so it does not keep
  the function's queue: its calls would wait for a rollback that may never come. A call running on a replica that is
  still alive is left to finish there (its version drains); its message goes at a later pass.
- **A function that comes back** (a rollback to a version that has it) has its consumer made again, and a function
  whose event stream should take other subjects (a rollback to a version that binds it elsewhere) has its stream
  rebound: to the ``on=`` of the version rolled out or back to, else of the newest running version that has it
  (``stream_subjects``), as at a push.
- **Pinned queues** follow the versions kept: made for the version rolled out, dropped (what waits cancelled) with a
  version no longer kept, so that calls pinned to a kept version still run after ``ember rollback`` to it.

Each pass is idempotent. Another control plane may write the deployment meanwhile: a pass decides from the
deployment as stored (not from what it wrote), and reads it again once done, making again any consumer it deleted of
a function that came back meanwhile (the writer that brought it back makes it too, after its own write). A pass that
failed, or a call queued by a gateway that had not yet seen the change, is caught by the next pass: at each write of
the deployment, and at the control plane's start. Deleting the app drops every queue it ever had
(``Calls.remove``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection

from ember.wire import CallRecord, Deployment, FunctionSpec, Release
from ember_platform.calls.durable import Calls

log = logging.getLogger("ember.registry")
Stored = Callable[[str], Awaitable[Deployment | None]]  # the app's deployment as stored now (None: not deployed)


def functions(dep: Deployment | Release) -> dict[str, FunctionSpec]:
    """The functions of one version, by name."""
    return {fn.name: fn for svc in dep.manifest.services for fn in svc.functions}


def kept(dep: Deployment) -> list[Release]:
    """Every version ``dep`` keeps, its own among them, oldest first."""
    own = dep.release(dep.version)
    return sorted([*dep.releases, *([own] if own is not None else [])], key=lambda r: r.version)


def pulled(dep: Deployment | None) -> set[str]:
    """The functions whose own queue the replicas of ``dep``'s running versions pull."""
    if dep is None:
        return set()
    return {name for v in dep.running() if (at := dep.release(v)) is not None for name in functions(at)}


def newest_first(dep: Deployment) -> list[Release]:
    """The running versions of ``dep``, its own first (the one pushed or rolled back to), then the newest."""
    order = [dep.version, *sorted(dep.running() - {dep.version}, reverse=True)]
    return [at for v in order if (at := dep.release(v)) is not None]


def stream_subjects(dep: Deployment | None) -> dict[str, list[str]]:
    """The subjects each bound function's event stream takes: the ``on=`` of the first of ``newest_first`` that has
    the function (the version the events tokens' permissions follow, when it has it)."""
    taken: dict[str, list[str]] = {}
    for at in newest_first(dep) if dep is not None else []:
        for name, fn in functions(at).items():
            taken.setdefault(name, list(fn.on))
    return {name: on for name, on in taken.items() if on}


def removal_reason(dep: Deployment, function: str) -> str:
    """Why a call of ``function`` waiting in its queue will not run, as its record says: the version that removed the
    function (the first kept after the last that has it), or the rollback to a version without it."""
    versions = kept(dep)
    had = [r.version for r in versions if function in functions(r)]
    if had and dep.version < max(had):
        return (f"the app {dep.app!r} was rolled back to version {dep.version}, which has no function {function!r}, "
                "before the call ran")
    if not had:  # removed in a version no longer kept
        return (f"the function {function!r} was removed from the app {dep.app!r} (version {dep.version} has none) "
                "before the call ran")
    removed_in = min((r.version for r in versions if r.version > max(had)), default=dep.version)
    return f"the function {function!r} was removed from the app {dep.app!r} in version {removed_in} before the call ran"


class Queues:
    """The queue side of deployment changes (see the module's docstring)."""

    def __init__(self, calls: Calls, stored: Stored, replica_alive: Callable[[str], bool]) -> None:
        self._calls = calls
        self._stored = stored
        self._alive = replica_alive

    async def follow(self, before: Deployment | None, after: Deployment) -> None:
        """After a write of ``after`` over ``before``: pinned queues, functions back, functions gone."""
        await self._pinned(before, after)
        if before is None:
            return  # a first push: its consumers were made before it was written
        back = pulled(after) - pulled(before)
        was = stream_subjects(before)  # a rollback (or a canary's) rebinds a function that stays
        back |= {name for name, on in stream_subjects(after).items() if was.get(name, on) != on}
        if back:
            await self._ensure(after, back)
        try:
            stray = await self._calls.functions_waiting(after.app)  # calls left by a pass before (or one that failed)
        except Exception:
            log.exception("could not read the queues of %s", after.app)
            stray = set()
        try:  # the write stands whatever comes of this: the next pass retires what this one could not
            await self.retire(after.app, (pulled(before) | stray) - pulled(after))
        except Exception:
            log.exception("could not retire the functions %s no longer has", after.app)

    async def sweep(self, deployments: Collection[Deployment]) -> None:
        """At the start of a control plane: the functions of every app that no running version has (those a pass
        left behind: its control plane stopped first, say) are retired."""
        for dep in deployments:
            try:
                stray = await self._calls.functions_waiting(dep.app)
                await self.retire(dep.app, ({n for r in kept(dep) for n in functions(r)} | stray) - pulled(dep))
            except Exception:
                log.exception("could not retire the functions %s no longer has", dep.app)

    async def retire(self, app: str, names: set[str]) -> None:
        """Retire those of ``names`` that the app's running versions, as stored now, do not have."""
        current = await self._stored(app) if names else None
        if current is None:
            return  # nothing to do, or the app was deleted: its deletion drops its queues
        names = names - pulled(current)
        bound = {name for r in kept(current) for name, fn in functions(r).items() if fn.on}
        for name in sorted(names):
            try:
                walked = await self._calls.retire_function(app, name, removal_reason(current, name),
                                                           spare=self._running, events=name in bound)
            except Exception:
                log.exception("could not retire %s.%s", app, name)
                continue
            if walked.cancelled or walked.spared:
                log.info("%s.%s: no version taking calls has it: %d queued call(s) cancelled, %d running left to "
                         "finish", app, name, walked.cancelled, walked.spared)
        again = await self._stored(app) if names else None
        if again is not None and names & pulled(again):  # brought back meanwhile, by another control plane
            await self._ensure(again, names & pulled(again))

    async def deleted(self, dep: Deployment) -> None:
        """After ``dep``'s app was deleted: every queue it ever had is dropped. If the app was pushed again meanwhile
        (another control plane), the queues of its new versions are made again."""
        await self._calls.remove(dep.app, [r.manifest for r in kept(dep)])
        again = await self._stored(dep.app)
        if again is not None:
            await self._ensure(again, pulled(again))
            for v in sorted(again.running()):
                if (at := again.release(v)) is not None:
                    await self._calls.ensure_pinned(at.manifest, v)

    def _running(self, record: CallRecord) -> bool:
        """A call that runs on a replica still alive: it finishes there (its version drains)."""
        return record.status == "running" and bool(record.replica) and self._alive(record.replica)

    async def _ensure(self, dep: Deployment, names: set[str]) -> None:
        """The consumers (and event streams) of ``names``, from the running versions of ``dep`` that have them."""
        for at in newest_first(dep):
            mine = names & set(functions(at))
            if not mine:
                continue
            try:
                await self._calls.ensure_consumers(at.manifest, only=mine)
            except Exception:  # its replicas retry binding; the next pass makes it
                log.exception("could not make the queues of %s v%d", dep.app, at.version)
            names = names - mine

    async def _pinned(self, before: Deployment | None, after: Deployment) -> None:
        """The version ``after`` rolls out has its pinned queues; the versions it no longer keeps lose theirs."""
        if before is None or before.version != after.version:
            await self._calls.ensure_pinned(after.manifest, after.version)
        still = {r.version for r in after.releases} | {after.version}
        for gone in [r for r in (before.releases if before else []) if r.version not in still]:
            try:
                await self._calls.remove_pinned(gone.manifest, gone.version)
            except Exception:  # left behind: deleting the app removes it
                log.exception("could not remove the pinned queues of %s v%d", after.app, gone.version)
