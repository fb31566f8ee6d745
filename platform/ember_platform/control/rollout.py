"""Rollouts as pure functions of an app's ``Deployment``: push, canary, promote, rollback, and the switch of
traffic once a version is ready. The registry writes what these return (compare-and-set on the deployments
KV, so that every control plane agrees); the control loop asks ``switch`` each tick.

The rules:

- a pushed version takes no call until its minimum replicas are ready (at least one per service where an
  older version served it); until then the versions in ``traffic`` keep serving;
- a canary (``canary_percent``) takes that share once ready, its ``stable`` version the rest, until it is
  promoted (all traffic) or rolled back (its replicas stop);
- a rollback makes an older kept version the one to serve: at once when it still serves, else once ready;
- versions that leave ``traffic`` drain (see ``switching.DRAIN_GRACE_S``) and stop; the last few are
  kept (bundle and manifest) for rollback and pinned calls;
- the version that last left ``traffic`` is ``warm``: its replicas stay a while, taking no calls (see
  ``switching``), and a rollback to it while they are ready switches at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable
from typing import Any

import msgspec

from ember._errors import ConflictError, InvalidInputError, NotFoundError
from ember.wire import Deployment, DeployRequest, Release, TrafficShare, encoder

KEEP_VERSIONS = 10  # versions kept besides the deployment's own, the serving ones always among them
KEEP_BYTES = 3 * 1024 * 1024  # what the kept manifests may add to a deployment (a KV value holds 4 MiB)
MAX_VERSION = 999_999_999


def record_push(current: Deployment | None, app: str, request: DeployRequest, now: float) -> Deployment:
    """The deployment after pushing ``request`` (a new version, rolled out or as a canary)."""
    percent = request.canary_percent
    if not 0 <= percent <= 99:
        raise InvalidInputError("canary_percent is a share of calls from 1 to 99 (0: a full rollout)",
                                field="$.canary_percent")
    if current is None:
        if percent:
            raise ConflictError(f"app {app!r} has no version yet to keep serving beside a canary: push it first "
                                "without --canary")
        return Deployment(app=app, version=1, bundle_sha256=request.bundle_sha256, manifest=request.manifest,
                          created_at=now, traffic=[TrafficShare(version=1, percent=100)], switched_at=now, latest=1,
                          born_at=now)
    if percent and current.canary_percent:
        raise ConflictError(f"app {app!r} already has a canary (v{current.version} at {current.canary_percent}%): "
                            "`ember promote` or `ember rollback` it first")
    version = max(current.latest, current.version, *(r.version for r in current.releases)) + 1
    serving = current.serving()
    stable = max(serving, key=lambda s: (s.percent, s.version)).version
    kept = _kept([*current.releases, _own(current)], {s.version for s in serving})
    return msgspec.structs.replace(current, version=version, bundle_sha256=request.bundle_sha256,
                                   manifest=request.manifest, created_at=now, releases=kept, traffic=serving,
                                   canary_percent=percent, stable=stable if percent else 0, latest=version)


def promote(current: Deployment, now: float) -> Deployment:
    """The canary takes all traffic once it has as many ready replicas as the versions it replaces (the control
    loop starts them and then switches), so that promoting never makes calls wait for a cold start."""
    if not current.canary_percent:
        raise ConflictError(f"app {current.app!r} has no canary to promote (v{current.version} is not one); "
                            "`ember push --canary PERCENT` starts one")
    return msgspec.structs.replace(current, canary_percent=0, stable=0)  # the loop switches once it has room


def rollback(current: Deployment, to: int, now: float, ready: Collection[int] = ()) -> Deployment:
    """``to`` (0: the version before) serves again; the versions it replaces drain and stop. ``ready``: the versions
    whose every service has a ready replica (a warm one switches back at once)."""
    target = to or _previous(current)
    if target == current.version and not current.canary_percent:
        if current.serving() == [TrafficShare(version=target, percent=100)]:
            raise ConflictError(f"app {current.app!r} already serves v{target} alone")
        return current
    release = current.release(target)
    if release is None:
        kept = sorted({current.version, *(r.version for r in current.releases)})
        raise NotFoundError(f"app {current.app!r} has no version {target} to roll back to (kept: "
                            f"{', '.join(f'v{v}' for v in kept)})")
    serving = current.serving()
    others = [r for r in [*current.releases, _own(current)] if r.version != target]
    dep = msgspec.structs.replace(current, version=release.version, bundle_sha256=release.bundle_sha256,
                                  manifest=release.manifest, created_at=release.created_at,
                                  releases=_kept(others, _versions(serving)), canary_percent=0, stable=0)
    if target in _versions(serving) or (target == current.warm and target in ready):  # no need to wait for them
        dep = _switch(dep, [TrafficShare(version=target, percent=100)], now)
    return dep


def main(dep: Deployment) -> Deployment:
    """The version that takes the app's calls, as its deployment (a canary's stable version, else the one taking the
    most): whose schedules are the app's, not those of one still starting, which may never become ready."""
    if dep.canary_percent and dep.stable:
        version = dep.stable
    else:
        version = max(dep.serving(), key=lambda share: (share.percent, share.version)).version
    return dep.at(version) or dep


def ready_to_serve(dep: Deployment, replicas: Iterable[Any]) -> set[int]:
    """The versions of ``dep``'s app (given its live ``replicas``) each of whose services has as many ready replicas
    as the versions serving now have of it (one at least, at most its ``max_replicas``): a rollback to one switches
    at once without its calls falling on fewer replicas (a warm version keeps only its ``min_replicas``, or one,
    while the version leaving may have served on twenty; otherwise the control loop starts them, then switches)."""
    ready = Counter((r.version, r.service) for r in replicas if r.state == "ready")
    serving = {share.version for share in dep.serving()}
    found = set()
    for version in {version for version, _ in ready}:
        at = dep.at(version)
        if at is not None and all(
                ready[version, svc.name] >= max(1, min(sum(ready[v, svc.name] for v in serving - {version}),
                                                       max(at.bounds(svc)[1], 1)))
                for svc in at.manifest.services):
            found.add(version)
    return found


def wanted_traffic(dep: Deployment) -> list[TrafficShare]:
    """The split ``dep`` asks for once its version is ready."""
    if dep.canary_percent and dep.stable and dep.stable != dep.version:
        return [TrafficShare(version=dep.stable, percent=100 - dep.canary_percent),
                TrafficShare(version=dep.version, percent=dep.canary_percent)]
    return [TrafficShare(version=dep.version, percent=100)]


def rolling_out(dep: Deployment) -> bool:
    """Whether ``dep``'s traffic is still to switch to what it asks for."""
    return dep.serving() != wanted_traffic(dep)


def switch(dep: Deployment, version_ready: bool, now: float) -> Deployment | None:
    """The deployment with its traffic switched to what it asks for, once its version is ready; None when nothing
    is to change."""
    wanted = wanted_traffic(dep)
    if dep.serving() == wanted or not version_ready:
        return None
    serving = {s.version for s in wanted}
    return _switch(msgspec.structs.replace(dep, releases=_kept(dep.releases, serving)), wanted, now)


def split(shares: list[TrafficShare], draw: float) -> int:
    """The version that takes an unpinned call, for ``draw`` uniform in [0, 1)."""
    point = draw * sum(s.percent for s in shares)
    for share in shares:
        if point < share.percent:
            return share.version
        point -= share.percent
    return shares[-1].version


def parse_version(raw: str) -> int:
    """A version as a call pins it (``<app>@<version>``): a whole number from 1, ``v`` before it allowed."""
    digits = raw[1:] if raw[:1] in ("v", "V") else raw
    if not (digits.isascii() and digits.isdigit() and digits[0] != "0" and len(digits) <= 9):
        shown = raw if len(raw) <= 40 else raw[:40] + "..."
        raise InvalidInputError(f"{shown!r} is not a version: a whole number from 1 (as in app@3 or app@v3)",
                                field="version")
    return int(digits)


def _switch(dep: Deployment, traffic: list[TrafficShare], now: float) -> Deployment:
    """``dep`` with ``traffic``; the version leaving it that served most becomes the warm one (none left: a warm
    version that serves again is no longer warm)."""
    leaving = [s for s in dep.serving() if s.version not in _versions(traffic)]
    if leaving:
        warm, since = max(leaving, key=lambda s: (s.percent, s.version)).version, now
    else:
        warm, since = (0, 0.0) if dep.warm in _versions(traffic) else (dep.warm, dep.warm_since)
    return msgspec.structs.replace(dep, traffic=traffic, switched_at=now, warm=warm, warm_since=since)


def _own(dep: Deployment) -> Release:
    return Release(version=dep.version, bundle_sha256=dep.bundle_sha256, manifest=dep.manifest,
                   created_at=dep.created_at)


def _versions(shares: list[TrafficShare]) -> set[int]:
    return {s.version for s in shares}


def _previous(dep: Deployment) -> int:
    """What a bare rollback goes back to: during a canary, its stable version (whatever share the canary takes);
    during a rollout, the version other than the new one that serves most; else the newest kept version older than
    the serving one."""
    if dep.canary_percent and dep.stable and dep.stable != dep.version:
        return dep.stable
    others = [s for s in dep.serving() if s.version != dep.version]
    if others:
        return max(others, key=lambda s: (s.percent, s.version)).version
    older = [r.version for r in dep.releases if r.version < dep.version]
    if not older:
        raise ConflictError(f"app {dep.app!r} has no version before v{dep.version} to roll back to")
    return max(older)


def _kept(releases: list[Release], serving: set[int]) -> list[Release]:
    """``releases`` without duplicates, oldest first, cut to ``KEEP_VERSIONS`` and ``KEEP_BYTES`` by dropping the
    oldest that do not serve."""
    by_version = {r.version: r for r in releases}
    kept = [by_version[v] for v in sorted(by_version)]
    while len(kept) > KEEP_VERSIONS or (len(kept) > 1 and sum(len(encoder.encode(r)) for r in kept) > KEEP_BYTES):
        doomed = next((r for r in kept if r.version not in serving), None)
        if doomed is None:
            break
        kept.remove(doomed)
    return kept
