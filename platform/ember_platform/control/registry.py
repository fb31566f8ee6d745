"""The deployment registry: deployments and replicas from JetStream KV, bundles in the object store."""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import logging
import time
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.api import ConsumerConfig, DeliverPolicy
from nats.js.errors import KeyWrongLastSequenceError, ObjectNotFoundError
from nats.js.errors import NotFoundError as JsNotFound
from nats.js.kv import KeyValue

from ember._errors import ConflictError, InvalidInputError, NotFoundError
from ember.wire import (
    AppView,
    Deployment,
    DeployRequest,
    FunctionSpec,
    LogLine,
    ReplicaStatus,
    ScaleBounds,
    ServiceSpec,
    ServiceView,
    VersionView,
    deployment_decoder,
    encoder,
    log_decoder,
    subjects,
)
from ember.wire.atomic import allow_atomic
from ember.wire.jetstream import REPLICA_TTL_S, KVMirror, Stores, ensure_buckets, kv_stream
from ember.wire.validate import check_manifest, check_scale
from ember_platform.calls.durable import Calls
from ember_platform.control import rollout
from ember_platform.control.bundle_gc import gc_grace_s, upload_time
from ember_platform.control.logfeed import LogFeed, LogFilter
from ember_platform.control.logstore import LogStore, running_services
from ember_platform.control.models import ModelClaims, named, served
from ember_platform.control.owners import Owners, covers
from ember_platform.control.queues import Queues
from ember_platform.control.replica_mirror import ReplicaMirror

log = logging.getLogger("ember.registry")
LOG_REPLAY_S = 3600.0  # how much of the kept output a starting control plane reads back


class Registry:
    """What is deployed and which replicas serve it, mirrored from NATS into memory."""

    def __init__(self, nc: Client, log_lines_kept: int, ack_wait_s: float) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.stores: Stores  # set by start()
        self.deployments: KVMirror[Deployment]  # set by start()
        self.replicas: ReplicaMirror
        self._by_app: tuple[int, dict[str, list[ReplicaStatus]]] = (-1, {})  # live_replicas' index, as of
        self._logs = LogStore(log_lines_kept)  # the kept output, which follows what runs
        self._log_sub: Any = None
        self.log_feed = LogFeed()  # the clients following the logs (``ember logs -f``)
        self._deploy_lock = asyncio.Lock()
        self._ack_wait_s = ack_wait_s
        self._refresh_after_s = gc_grace_s() / 2  # an older stored copy of an uploaded bundle is written again
        self.calls: Calls  # set by start()
        self.queues: Queues  # set by start(): what a change of a deployment does to its app's queues
        self.owners: Owners  # set by start(): who uploaded each bundle and volume chunk
        self.models: ModelClaims  # set by start(): which app holds each served model name

    async def start(self) -> None:
        self.stores = await ensure_buckets(self.js)
        for stream in (kv_stream(subjects.CALLS_BUCKET), subjects.CALLS_STREAM):  # the schedule loop's batches
            await allow_atomic(self.js, stream)
        self.owners = await Owners.open(self.js)
        self.models = await ModelClaims.open(self.js, self.stores.deployments)
        self.calls = Calls(self.nc, self.stores, self._ack_wait_s, self.event_app)
        self.queues = Queues(self.calls, self._stored_deployment, self.replica_alive)
        self.deployments = KVMirror(self.stores.deployments, deployment_decoder.decode, heal=encoder.encode,
                                    on_change=lambda app, dep: self._logs.keep(app, running_services(dep)))
        # a replica that turns ready wakes the control loop as a changed deployment does: a rollout waiting for it
        # switches then, not at the next tick (up to TICK_S later, while its first calls go to the old version)
        self.replicas = ReplicaMirror(self.stores.replicas, on_ready=self.deployments.changed.set)
        await self.deployments.start()
        await self.replicas.start()
        self._log_sub = await self._follow_logs()
        await self._queues_of_running_versions()
        await self._claims_of_running_versions()

    async def _claims_of_running_versions(self) -> None:
        """Every deployed app holds the model names it serves (those deployed before names were claimed get them)."""
        for dep in list(self.deployments.items.values()):
            try:
                await self.models.claim(dep.app, served(dep))
            except ConflictError as exc:
                log.warning("app %s: %s", dep.app, exc)

    async def _queues_of_running_versions(self) -> None:
        """Every running version has its pinned queues (those deployed before pinned calls existed get them now, so
        that their replicas find what they pull), and the functions no running version has are retired."""
        for dep in list(self.deployments.items.values()):
            for version in sorted(dep.running()):
                at = dep.at(version)
                try:
                    if at is not None:
                        await self.calls.ensure_pinned(at.manifest, version)
                except Exception:  # the app's replicas retry binding; its spawns pinned to it would fail
                    log.exception("could not create the pinned queues of %s v%d", dep.app, version)
        await self.queues.sweep(list(self.deployments.items.values()))

    async def _follow_logs(self) -> Any:
        """The replicas' output from the ``EMBER_LOGS`` stream: the last ``LOG_REPLAY_S`` of it first (so that
        the logs API outlives a restart of the control plane), then as it comes."""
        since = datetime.datetime.fromtimestamp(time.time() - LOG_REPLAY_S, tz=datetime.UTC)
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_TIME, opt_start_time=since)
        return await self.js.subscribe(subjects.LOGS_ALL, stream=subjects.LOGS_STREAM, cb=self._on_log,
                                       ordered_consumer=True, config=config)

    async def stop(self) -> None:
        if self._log_sub is not None:
            await self._log_sub.unsubscribe()
        await self.deployments.stop()
        await self.replicas.stop()

    # -- functions ---------------------------------------------------------------------------------

    def resolve(self, app: str, name: str) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
        """The current deployment of ``app.name``, its service and function; ``NotFoundError`` otherwise."""
        dep = self.deployments.items.get(app)
        if dep is None:
            raise NotFoundError(f"no app named {app!r} is deployed")
        return self._find(dep, name)

    def route(self, app: str, name: str, pinned: int | None,
              draw: float) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
        """The version of ``app`` that takes a call to ``name`` (``pinned``, else drawn by the traffic split with
        ``draw`` uniform in [0, 1)), seen as that version's deployment, with its service and function.
        ``NotFoundError`` for an unknown app, version or function, and for a pinned version that has no replicas."""
        dep = self.deployments.items.get(app)
        if dep is None:
            raise NotFoundError(f"no app named {app!r} is deployed")
        serving = dep.serving()
        version = pinned if pinned is not None else (serving[0].version if len(serving) == 1
                                                     else rollout.split(serving, draw))
        if version != dep.version:
            running = dep.running()
            at = dep.at(version) if version in running else None
            if at is None:
                kept = sorted(running)
                what = "has no replicas" if dep.release(version) else "does not exist"
                raise NotFoundError(f"version {version} of app {app!r} {what} (running: "
                                    f"{', '.join(f'v{v}' for v in kept)})")
            dep = at
        return self._find(dep, name)

    def _find(self, dep: Deployment, name: str) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
        for svc in dep.manifest.services:
            for fn in svc.functions:
                if fn.name == name:
                    return dep, svc, fn
        known = ", ".join(f.name for s in dep.manifest.services for f in s.functions)
        raise NotFoundError(f"app {dep.app!r} (v{dep.version}) has no function {name!r} (it has: {known})")

    def event_app(self, scope: str) -> str | None:
        """The app one of whose functions' event streams has ``scope`` (``subjects.event_scope``), or None."""
        for dep in list(self.deployments.items.values()):
            for manifest in (dep.manifest, *(release.manifest for release in dep.releases)):
                for svc in manifest.services:
                    if any(fn.on and subjects.event_scope(subjects.events_stream(dep.app, fn.name)) == scope
                           for fn in svc.functions):
                        return dep.app
        return None

    def deployed_service(self, app: str, service: str) -> bool:
        """Whether ``app``'s current version has a service ``service``."""
        dep = self.deployments.items.get(app)
        return dep is not None and any(s.name == service for s in dep.manifest.services)

    def live_replicas(self, app: str, service: str | None = None) -> list[ReplicaStatus]:
        """``app``'s replicas (of ``service``) that reported lately, by service, version and id. Read from the
        statuses grouped by app, grouped again when they change (the control loop asks for each running service
        twice a tick: a scan of every status each time cost services times replicas)."""
        generation, by_app = self._by_app
        if generation != self.replicas.generation:
            by_app = defaultdict(list)
            for status in self.replicas.items.values():
                by_app[status.app].append(status)
            self._by_app = (self.replicas.generation, by_app)
        fresh_after = time.time() - REPLICA_TTL_S
        return sorted((r for r in by_app.get(app, ()) if (service is None or r.service == service)
                       and r.updated_at > fresh_after), key=lambda r: (r.service, r.version, r.replica_id))

    def replica_of(self, replica_id: str, app: str) -> bool:
        """Whether ``replica_id`` is a replica of ``app`` that reported its status."""
        status = self.replicas.items.get(replica_id)
        return status is not None and status.app == app

    def replica_alive(self, replica_id: str) -> bool:
        """False once a replica crashed, stopped reporting, or was removed."""
        status = self.replicas.items.get(replica_id)
        return (status is not None and status.state not in ("crashed", "failed")
                and status.updated_at > time.time() - REPLICA_TTL_S)

    # -- deployments -------------------------------------------------------------------------------

    async def put_bundle(self, sha256: str, data: bytes, patterns: list[str]) -> bool:
        """Store a bundle under its sha256 (verified) for the apps ``patterns`` match; False when those patterns
        were recorded for it already (whether another tenant stored the same bytes is not told: they are stored
        once, and its patterns recorded beside theirs).

        A copy stored long ago is written again all the same: the bundle collector spares only what is in use or
        was uploaded within its grace period, and a push uploads before it deploys."""
        digest = hashlib.sha256(data).hexdigest()
        if digest != sha256:
            raise InvalidInputError(f"bundle sha256 is {digest}, not the {sha256} in the URL", field="$body")
        uploaded = await self._uploaded_at(sha256)
        if uploaded is None or time.time() - uploaded >= self._refresh_after_s:
            await self.stores.bundles.put(sha256, data)
        return await self.owners.add("bundle", sha256, patterns) or uploaded is None

    async def _uploaded_at(self, sha256: str) -> float | None:
        try:
            info = await self.stores.bundles.get_info(sha256)
        except (ObjectNotFoundError, JsNotFound):
            return None
        return None if info.deleted else upload_time(info.mtime)

    async def has_bundle(self, sha256: str, app: str | None = None) -> bool:
        """Whether the bundle is stored and, given ``app``, uploaded for it (by a token whose patterns match it):
        knowing a bundle's hash does not let another tenant deploy it."""
        if app is not None and not covers(await self.owners.patterns("bundle", sha256), app):
            return False
        return await self._uploaded_at(sha256) is not None

    async def deploy(self, app: str, request: DeployRequest, *, any_content: bool = False) -> Deployment:
        """Record a new version of ``app`` (or return the current one when nothing changed). Its bundle must have
        been uploaded for ``app``, and its images locked by a build of ``app`` (unless ``any_content``: an admin's
        push): 404 otherwise, word for word that of a bundle never uploaded or an image never locked."""
        if request.manifest.app != app:
            raise InvalidInputError(f"manifest is for app {request.manifest.app!r}, not {app!r}",
                                    field="$.manifest.app")
        check_manifest(request.manifest)
        if not await self.has_bundle(request.bundle_sha256, None if any_content else app):
            raise no_such_bundle(request.bundle_sha256)
        if not any_content:
            await self._check_image_owners(app, request.manifest.services)
        rollout.record_push(self.deployments.items.get(app), app, request, time.time())  # its 409 or 422 first
        claimed = await self.models.claim(app, named(request.manifest))  # a 409 before anything is made for it
        try:  # a push refused binds no event stream to its subjects (the serving version's events went unheard)
            await self.calls.ensure_consumers(request.manifest)
            return await self._update(app, lambda current: _pushed(app, request, current), create=True)
        except BaseException:
            await self.models.release_after(app, claimed)
            raise

    async def _check_image_owners(self, app: str, services: list[ServiceSpec]) -> None:
        """Each locked image was locked by a build of ``app``: 404 naming the field otherwise."""
        for i, service in enumerate(services):
            image = service.image
            if image is not None and image.locked and not covers(await self.owners.patterns("image", image.sha256),
                                                                 app):
                raise NotFoundError(f"no build of app {app!r} locked image {image.sha256[:12]}: push with `ember "
                                    "push`, which has the platform lock and build it",
                                    field=f"$.manifest.services[{i}].image.sha256")

    async def promote(self, app: str) -> Deployment:
        """The canary takes all traffic (``ember promote``)."""
        return await self._switching(app, lambda dep: rollout.promote(_exists(app, dep), time.time()))

    async def rollback(self, app: str, to: int = 0) -> Deployment:
        """Version ``to`` (0: the one before) serves again (``ember rollback``): at once when its replicas are ready
        (it serves, or it is warm)."""
        return await self._switching(app, lambda dep: rollout.rollback(_exists(app, dep), to, time.time(),
                                                                       self.ready_versions(_exists(app, dep))))

    async def _switching(self, app: str, change: Callable[[Deployment | None], Deployment]) -> Deployment:
        """``change`` written, the replicas of the versions it takes out of the traffic told first to pull no more
        queued calls (as the control loop tells them after): a call queued once the switch is seen runs on the
        version that serves. (A change refused raises here, as in ``_update``.)"""
        current = self.deployments.items.get(app)
        leaving = current.running() - change(current).running() if current is not None else set()
        for r in [r for r in self.live_replicas(app) if r.version in leaving]:
            await self.nc.publish(subjects.replica_standby(r.replica_id), subjects.STANDBY)
        return await self._update(app, change)

    def ready_versions(self, dep: Deployment) -> set[int]:
        """The versions of ``dep``'s app with the ready replicas to take its calls now (``rollout.ready_to_serve``)."""
        return rollout.ready_to_serve(dep, self.live_replicas(dep.app))

    async def switch_traffic(self, app: str, expected: Deployment, version_ready: bool) -> Deployment | None:
        """The control loop's switch of ``app``'s traffic to its version once ready; None when the deployment is no
        longer ``expected`` (pushed again meanwhile: the next tick decides) or nothing is to change."""
        changed = False

        def change(dep: Deployment | None) -> Deployment | None:
            nonlocal changed
            if dep != expected:
                return None
            switched = rollout.switch(dep, version_ready, time.time())
            changed = switched is not None
            return switched

        dep = await self._update(app, change)
        return dep if changed else None

    async def _update(self, app: str, change: Callable[[Deployment | None], Deployment | None], *,
                      create: bool = False) -> Deployment:
        """Write ``change(current)`` with compare-and-set (several control planes may write at once); what it
        returns None for is left as it is, and returned. ``NotFoundError`` for an app not deployed unless
        ``create``."""
        kv = self.stores.deployments
        async with self._deploy_lock:
            for _ in range(10):
                current, revision = await self._stored(app)
                if current is None and not create:
                    raise NotFoundError(f"no app named {app!r} is deployed")
                dep = change(current)
                if dep is None:
                    assert current is not None
                    return current
                claimed = await self.models.claim(app, served(dep))  # 409 before anything is written
                try:
                    if revision is None:
                        written = await kv.create(app, encoder.encode(dep))
                    else:
                        written = await kv.update(app, encoder.encode(dep), last=revision)
                except BaseException as exc:
                    await self.models.release_after(app, claimed)
                    if isinstance(exc, KeyWrongLastSequenceError):
                        continue
                    raise
                self.deployments.record(app, dep, written)  # read-your-writes
                await self.models.release_after(app, served(current).keys() - served(dep).keys())
                break
            else:
                raise RuntimeError(f"could not record a deployment of {app!r}: concurrent writers")
        # Outside the lock: a pass walks the queues it retires (a few requests per waiting call), and every other
        # app's writes (a rollout's switch among them) would wait for it. Passes are idempotent (``queues``).
        await self.queues.follow(current, dep)
        return dep

    async def _stored(self, app: str) -> tuple[Deployment | None, int | None]:
        """The app's deployment as stored, and its revision; (None, None) for none. A spoiled entry (``Spoiled``)
        reads as the last good deployment this control plane saw, at the spoiled entry's revision: the next write
        puts a deployment back over it."""
        try:
            return _deployment(await self.stores.deployments.get(app))
        except JsNotFound:
            return None, None
        except Spoiled as spoiled:
            return self.deployments.items.get(app), spoiled.revision

    async def _stored_deployment(self, app: str) -> Deployment | None:
        return (await self._stored(app))[0]

    async def delete(self, app: str) -> None:
        """Delete ``app``: its deployment, model names, and every queue it ever had (what waits there is cancelled)."""
        if app not in self.deployments.items:
            raise NotFoundError(f"no app named {app!r} is deployed")
        found, revision = await self._stored(app)
        current = _exists(app, found)
        await self.stores.deployments.delete(app)
        await self.models.release_after(app, served(current))
        await self.queues.deleted(current)
        self.deployments.record(app, None, (revision or 0) + 1)
        self._logs.keep(app, ())  # its name deployed again starts with none of its output

    def view(self, app: str) -> AppView:
        dep = self.deployments.items.get(app)
        if dep is None:
            raise NotFoundError(f"no app named {app!r} is deployed")
        services = [ServiceView(name=s.name, min_replicas=dep.bounds(s)[0], max_replicas=dep.bounds(s)[1],
                                functions=[f.name for f in s.functions],
                                replicas=self.live_replicas(app, s.name))
                    for s in dep.manifest.services]
        return AppView(app=app, version=dep.version, bundle_sha256=dep.bundle_sha256, created_at=dep.created_at,
                       services=services, versions=self._versions(dep), switched_at=dep.switched_at)

    def _versions(self, dep: Deployment) -> list[VersionView]:
        shares = {s.version: s.percent for s in dep.serving()}
        ready: dict[int, int] = defaultdict(int)
        live: set[int] = set()
        for r in self.live_replicas(dep.app):
            live.add(r.version)
            ready[r.version] += r.state == "ready"
        views = []
        own = dep.release(dep.version)
        assert own is not None
        for release in sorted([*dep.releases, own], key=lambda r: -r.version):
            v = release.version
            state: Any = ("canary" if v == dep.version and dep.canary_percent and v in shares else
                          "serving" if v in shares else
                          "rolling-out" if v == dep.version else
                          "draining" if v in live else "kept")
            views.append(VersionView(version=v, percent=shares.get(v, 0), state=state,
                                     bundle_sha256=release.bundle_sha256, created_at=release.created_at,
                                     ready=ready[v], warm=v == dep.warm and state == "draining"))
        return views

    # -- logs --------------------------------------------------------------------------------------

    async def _on_log(self, msg: Msg) -> None:
        """A line from a node agent: ``ember.logs.<app>.<service>.<node>`` (NATS lets only that node's agent
        publish there). It is kept with that node, and dropped if it names a replica that runs elsewhere: a node
        speaks only for its own replicas. (Four-token subjects: lines stored before nodes were named.)"""
        parts = msg.subject.split(".")
        if len(parts) not in (4, 5):
            return
        try:
            line = log_decoder.decode(msg.data)
        except msgspec.MsgspecError:
            return
        if len(parts) == 5:
            node = parts[4]
            replica = self.replicas.items.get(line.replica_id)
            if replica is not None and replica.node_id != node:
                return
            line = msgspec.structs.replace(line, node_id=node)
        if parts[3] in running_services(self.deployments.items.get(parts[2])):  # else not kept: see ``LogStore``
            self._logs.add(parts[2], parts[3], line)
        self.log_feed.publish(parts[2], parts[3], line)

    def logs(self, flt: LogFilter, limit: int) -> list[LogLine]:
        """The last ``limit`` kept lines that ``flt`` wants, oldest first."""
        return self._logs.lines(flt, limit)

    # -- scale -------------------------------------------------------------------------------------

    async def set_scale(self, app: str, service: str, min_replicas: int, max_replicas: int) -> Deployment:
        """Override ``service``'s replica bounds at run time (``ember scale``); the control loop follows.

        The bounds are kept in the app's ``Deployment.scale``, written with compare-and-set.
        """
        check_scale(min_replicas, max_replicas)
        kv = self.stores.deployments
        async with self._deploy_lock:
            for _ in range(10):
                found, revision = await self._stored(app)
                current = _exists(app, found)
                names = [s.name for s in current.manifest.services]
                if service not in names:
                    raise InvalidInputError(f"app {app!r} has no service {service!r} (it has: {', '.join(names)})",
                                            field="$.service")
                bounds = ScaleBounds(min_replicas=min_replicas, max_replicas=max_replicas)
                dep = msgspec.structs.replace(current, scale={**current.scale, service: bounds})
                try:
                    written = await kv.update(app, encoder.encode(dep), last=revision)
                except KeyWrongLastSequenceError:
                    continue
                self.deployments.record(app, dep, written)
                return dep
        raise RuntimeError(f"could not scale {app}.{service}: concurrent writers")


def no_such_bundle(sha256: str) -> NotFoundError:
    """The 404 of a bundle never uploaded, and of one uploaded only for other apps."""
    return NotFoundError(f"bundle {sha256} was not uploaded; PUT /v1/bundles/<sha256> first", field="$.bundle_sha256")


def _exists(app: str, dep: Deployment | None) -> Deployment:
    if dep is None:
        raise NotFoundError(f"no app named {app!r} is deployed")
    return dep


class Spoiled(Exception):
    """A deployments entry that is neither a deployment nor a deletion: a server's answer sent there, as the reply
    subject of a request a client named it in (NATS checks no permission on a reply subject); its ``revision``."""

    def __init__(self, revision: int) -> None:
        super().__init__(revision)
        self.revision = revision


def _deployment(entry: KeyValue.Entry) -> tuple[Deployment, int]:
    """A deployments KV entry as the deployment it holds and its revision (``JsNotFound`` for a deleted one,
    ``Spoiled`` for one that holds no deployment)."""
    if entry.revision is None:
        raise JsNotFound
    try:
        return deployment_decoder.decode(entry.value or b""), entry.revision
    except msgspec.DecodeError:
        raise Spoiled(entry.revision) from None


def _pushed(app: str, request: DeployRequest, dep: Deployment | None) -> Deployment | None:
    same = dep is not None and (dep.bundle_sha256, dep.manifest) == (request.bundle_sha256, request.manifest)
    return None if same and not request.canary_percent else rollout.record_push(dep, app, request, time.time())
