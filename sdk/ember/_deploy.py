"""``ember.deploy``: inspect, bundle, upload and roll out an app, then wait for its replicas."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ember._build import build_images, plan_images
from ember._bundle import build_bundle
from ember._client import Transport, default_transport
from ember._errors import EmberError, InvalidSpecError, NotFoundError, RemoteError, UnavailableError
from ember.wire import AppView, Deployment, DeployRequest, Manifest, RolloutRequest, StatusView, encoder

Progress = Callable[[str, AppView | None], None]
WHY_EVERY_S = 2.0  # how often a wait whose replicas are not ready asks the platform why (``GET /v1/status``)


def inspect_app(path: str | Path, app_name: str | None = None) -> Manifest:
    """Import the app file in a fresh interpreter and return its manifest."""
    cmd = [sys.executable, "-m", "ember._inspect", str(path), *([app_name] if app_name else [])]
    proc = subprocess.run(cmd, capture_output=True, timeout=300, check=False)
    if proc.returncode != 0:
        raise InvalidSpecError(f"importing {path} failed:\n{proc.stderr.decode(errors='replace').strip()}")
    return msgspec.json.decode(proc.stdout, type=Manifest)


def deploy(path: str | Path, *, app_name: str | None = None, wait: bool = True, timeout_s: float = 300.0,
           transport: Transport | None = None, progress: Progress | None = None, canary_percent: int = 0,
           relock: bool = False) -> AppView:
    """Deploy the app defined in ``path`` and (by default) wait until the new version takes its calls.

    The app's folder is the bundle: every file in it but caches and ``.gitignore``d ones. A new version is rolled
    out without downtime: the version before keeps serving until the new one's minimum replicas are ready, then
    drains. With ``canary_percent`` (1 to 99) the new version takes only that share of calls once ready, until
    ``promote`` or ``rollback``. An app with an image has it locked and built on the platform first (see
    docs/guides/images.md); an image that did not change keeps the running version's lock, unless ``relock``.

    Example:
        >>> ember.deploy("examples/hello/hello.py")
        >>> ember.deploy("examples/hello/hello.py", canary_percent=10)
    """
    say = progress or (lambda _msg, _view: None)
    transport = transport or default_transport()
    path = Path(path).resolve()
    say(f"inspecting {path.name}", None)
    found = plan_images(path, app_name)
    bundle = build_bundle(path.parent)
    say(f"bundle {bundle.sha256[:12]}: {len(bundle.files)} files, {len(bundle.data) / 1024:.1f} KiB", None)
    if bundle.skipped:
        shown = ", ".join(bundle.skipped[:10]) + (f" and {len(bundle.skipped) - 10} more" if len(bundle.skipped) > 10
                                                  else "")
        say(f"left out {len(bundle.skipped)} link(s) to files outside {path.parent.name}/: {shown}", None)
    transport.request("PUT", f"/v1/bundles/{bundle.sha256}", content=bundle.data, params={"app": found.app},
                      headers={"content-type": "application/gzip"})
    manifest = found.manifest  # an app with images: read on the platform, inside its image
    if found.images or manifest is None:
        manifest = build_images(transport, found, bundle.sha256, lambda line: say(line, None), relock=relock)
    body = encoder.encode(DeployRequest(bundle_sha256=bundle.sha256, manifest=manifest, canary_percent=canary_percent))
    dep = msgspec.json.decode(
        transport.request("POST", f"/v1/apps/{manifest.app}/deployments", content=body,
                          headers={"content-type": "application/json"}).content, type=Deployment)
    say(f"deployed {dep.app} version {dep.version}" + (f" as a {canary_percent}% canary" if canary_percent else ""),
        None)
    view = app_view(transport, dep.app)
    if wait:
        view = wait_ready(transport, dep.app, dep.version, timeout_s=timeout_s, progress=say)
    return view


def app_view(transport: Transport, app: str) -> AppView:
    return msgspec.json.decode(transport.request("GET", f"/v1/apps/{app}").content, type=AppView)


def promote(app: str, *, wait: bool = True, timeout_s: float = 300.0, transport: Transport | None = None,
            progress: Progress | None = None) -> AppView:
    """Give ``app``'s canary all of its calls (once it has as many ready replicas as the version it replaces);
    that version drains and stops. By default returns once the canary takes every call (as ``deploy`` waits);
    ``wait=False`` returns at once. ``ConflictError`` when the app has no canary.

    Example:
        >>> ember.promote("hello")
    """
    transport = transport or default_transport()
    view = msgspec.json.decode(transport.request("POST", f"/v1/apps/{app}/promote").content, type=AppView)
    return _settle(transport, view, "promoting", wait=wait, timeout_s=timeout_s, progress=progress)


def rollback(app: str, *, to: int | None = None, wait: bool = True, timeout_s: float = 300.0,
             transport: Transport | None = None, progress: Progress | None = None) -> AppView:
    """Serve an older kept version of ``app`` again: ``to``, else the one before (during a rollout or a canary, the
    version that serves). At once when it still serves or is kept warm (see docs/guides/rollouts.md), else once its
    replicas are ready; the versions it replaces drain. By default returns once that version takes every call (as
    ``deploy`` waits); ``wait=False`` returns at once. ``NotFoundError`` for a version the app does not keep.

    Example:
        >>> ember.rollback("hello", to=3)
    """
    transport = transport or default_transport()
    body = encoder.encode(RolloutRequest(version=to or 0))
    view = msgspec.json.decode(transport.request("POST", f"/v1/apps/{app}/rollback", content=body,
                                                 headers={"content-type": "application/json"}).content, type=AppView)
    return _settle(transport, view, "rolling back to", wait=wait, timeout_s=timeout_s, progress=progress)


def _settle(transport: Transport, view: AppView, doing: str, *, wait: bool, timeout_s: float,
            progress: Progress | None) -> AppView:
    """After a promote or rollback: with ``wait``, push's wait until ``view``'s version takes every call."""
    say = progress or (lambda _msg, _view: None)
    say(f"{doing} {view.app} v{view.version}", view)
    if not wait:
        return view
    return wait_ready(transport, view.app, view.version, timeout_s=timeout_s, progress=say, alone=True)


def wait_ready(transport: Transport, app: str, version: int, *, timeout_s: float, progress: Progress,
               alone: bool = False) -> AppView:
    """Poll until every service of ``version`` has its minimum ready replicas and the version takes its calls (a
    rollout switches once it is ready); with ``alone``, all of them (a promote or a rollback)."""
    deadline = time.monotonic() + timeout_s
    last, asked_at = "", time.monotonic()
    held: dict[str, str] = {}  # why services are held back, as the platform last said
    while True:
        try:
            view = app_view(transport, app)
        except NotFoundError:
            raise UnavailableError(f"app {app!r} was deleted while waiting for it") from None
        if view.version != version:
            raise UnavailableError(f"app {app!r} moved to version {view.version} while waiting for {version}")
        summary, ready = _readiness(view, held)
        ready &= _takes_calls(view, alone)
        if not ready and time.monotonic() - asked_at >= WHY_EVERY_S:
            held, asked_at = holding_back(transport, app, version), time.monotonic()
        if summary != last:
            progress(summary, view)
            last = summary
        if ready:
            return view
        failed = _failed(view)
        if failed:
            raise RemoteError(f"{app} v{version} failed: {failed}", remote_type="SetupFailed")
        if time.monotonic() > deadline:
            raise UnavailableError(f"{app} v{version} not ready after {timeout_s:.0f}s: {summary}",
                                   retry_after_s=5.0)
        time.sleep(0.2)


def _takes_calls(view: AppView, alone: bool = False) -> bool:
    """Whether the view's version takes calls (``alone``: all of them; a platform that shows no versions switches
    at once)."""
    own = next((v for v in view.versions if v.version == view.version), None)
    if own is None:
        return True
    return own.percent == 100 if alone else own.state in ("serving", "canary")


def _failed(view: AppView) -> str:
    """Why a service of the current version cannot come up: every replica it has is failed (not crashed, which
    is restarted)."""
    for svc in view.services:
        current = [r for r in svc.replicas if r.version == view.version]
        if svc.min_replicas and current and all(r.state == "failed" for r in current):
            return f"{svc.name}: {current[0].message or 'failed'}"
    return ""


def holding_back(transport: Transport, app: str, version: int) -> dict[str, str]:
    """What holds each service of ``app``'s ``version`` below the replicas it wants, as ``ember status`` says it:
    no node can take one (``unschedulable``: no GPU of its type, not enough free memory), or a quota. Empty where
    the platform cannot say (a token that may not read the status, a control plane that does not place now)."""
    try:
        view = msgspec.json.decode(transport.request("GET", "/v1/status", params={"app": app}).content,
                                   type=StatusView)
    except (EmberError, msgspec.ValidationError):
        return {}
    found = {}
    for s in view.services:
        why = [f"unschedulable: {s.unschedulable}"] if s.unschedulable else []
        why += [f"held back: {s.quota}"] if s.quota else []
        if s.app == app and s.version == version and why:
            found[s.service] = "; ".join(why)
    return found


def _readiness(view: AppView, held: dict[str, str] | None = None) -> tuple[str, bool]:
    parts, ready = [], True
    for svc in view.services:
        current = [r for r in svc.replicas if r.version == view.version]
        n_ready = sum(r.state == "ready" for r in current)
        ready &= n_ready >= svc.min_replicas
        problems = {r.message for r in current if r.state in ("crashed", "failed") and r.message}
        if n_ready < svc.min_replicas and (held or {}).get(svc.name):
            problems.add((held or {})[svc.name])
        note = f" ({'; '.join(sorted(problems))})" if problems else ""
        parts.append(f"{svc.name} {n_ready}/{svc.min_replicas} ready{note}")
    return ", ".join(parts), ready
