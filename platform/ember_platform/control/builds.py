"""Image builds at push time: ``POST /v1/apps/<app>/builds`` picks a live node, asks it to lock the app's images,
build their environments and read the app's manifest inside them (``ember_runtime.agent.builder``), and keeps
what the node says (uv's log, then the manifest or the error) for ``ember push`` to follow with
``GET /v1/apps/<app>/builds/<id>``.

A build is kept by the control plane that started it (in memory, the newest ``MAX_BUILDS``, each for
``KEEP_S``), which relays its node's events: with several control planes behind a load balancer, a push follows
its build through the one that answered its ``POST`` (``EMBER_URL`` pointing at one of them, or sticky sessions).
Every control plane hears every node's events; each keeps only those of its own builds, and only from the node
it asked.

A node's answer is not taken on its word: the manifest it returns is held to the one the pushing machine read
(``BuildStart.declared``; ``control.build_checks`` says what a build may change), and any other difference fails
the build, naming the field, and is logged with the node's id. Only the node asked may answer (its events come on
its own subject, which only it may publish to), and a build id is 128 random bits.

The images a build locks are recorded for its app (``control.owners``) once its manifest is verified, before the
build is shown ready: a deployment may name a locked image only if a build of that app locked it, so that a lock
seen elsewhere (its hash, its pinned hashes) does not mount another tenant's environment.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ember._errors import InvalidInputError, NotFoundError, UnavailableError
from ember.wire import Manifest, NodeInfo, encoder, subjects
from ember.wire.builds import BuildStart
from ember.wire.images import (
    BuildEvent,
    BuildRequest,
    BuildState,
    BuildView,
    ImageSpec,
    image_problems,
    same_declaration,
)
from ember.wire.validate import MODULE_NAME
from ember_platform.control.build_checks import check_declared, manifest_difference
from ember_platform.control.owners import Owners
from ember_platform.control.registry import no_such_bundle

log = logging.getLogger("ember.builds")
MAX_BUILDS = 256
MAX_LINES = 5000  # per build; older lines are dropped (and counted)
KEEP_S = 3600.0
SILENT_S = 120.0  # a build whose node said nothing for this long failed
MAX_IMAGES = 16
NODE_WAIT_S = 20.0  # how long a build waits for a live node before it is refused (503)
_event = msgspec.json.Decoder(BuildEvent)
_manifest = msgspec.json.Decoder(Manifest)


@dataclass
class Build:
    build_id: str
    app: str
    node_id: str
    state: BuildState = "queued"
    lines: list[str] = field(default_factory=list)
    dropped: int = 0  # lines before ``lines[0]`` no longer kept
    error: str = ""
    manifest_json: str = ""
    started_at: float = field(default_factory=time.time)
    heard_at: float = field(default_factory=time.monotonic)
    finished_at: float = 0.0
    declared: Manifest | None = None  # the manifest the pushing machine read: the node's answer is held to it
    bundle_sha256: str = ""  # the bundle the node reads for it (``control.node_reads``), while it builds

    def view(self, since: int) -> BuildView:
        start = max(since - self.dropped, 0)
        return BuildView(build_id=self.build_id, app=self.app, state=self.state, node_id=self.node_id,
                         lines=self.lines[start:start + 1000], next_line=self.dropped + min(len(self.lines),
                                                                                              start + 1000),
                         error=self.error, manifest_json=self.manifest_json,
                         started_at=self.started_at, finished_at=self.finished_at)


class Builds:
    def __init__(self, nc: Any, live_nodes: Callable[[], Mapping[str, NodeInfo]],
                 has_bundle: Callable[[str, str], Any],
                 running: Callable[[str], Iterable[ImageSpec]] = lambda _app: (),
                 grant: Callable[[str, str], str] = lambda _node, _bundle: "") -> None:
        self._nc = nc
        self._grant = grant  # (node, bundle) -> the grant that lets the node read the bundle (``node_reads``)
        self._running = running  # an app's locked images, as its current deployment has them
        self._live_nodes = live_nodes
        self._has_bundle = has_bundle
        self._builds: OrderedDict[str, Build] = OrderedDict()
        self._sub: Any = None
        self._owners: Owners | None = None  # set by start()

    async def start(self) -> None:
        self._owners = await Owners.open(self._nc.jetstream())
        self._sub = await self._nc.subscribe(subjects.NODE_BUILD_EVENTS_ALL,
                                             cb=subjects.only_on(subjects.NODE_BUILD_EVENTS_ALL, self._on_event))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def start_build(self, app: str, request: BuildStart) -> BuildView:
        """Check the request, pick a node, ask it; 422 naming the field, 503 without a live node."""
        _check(request)
        if not await self._has_bundle(request.bundle_sha256, app):  # uploaded for this app: a hash proves nothing
            raise no_such_bundle(request.bundle_sha256)
        check_declared(request.declared, app, request.module)
        nodes = self._live_nodes()
        deadline = time.monotonic() + NODE_WAIT_S
        while not nodes and time.monotonic() < deadline:  # a platform that just started: its nodes come
            await asyncio.sleep(0.2)
            nodes = self._live_nodes()
        if not nodes:
            raise UnavailableError("no node is up to build the image on", retry_after_s=5.0)
        node_id = _pick(nodes, request)
        build = Build(build_id=secrets.token_hex(16), app=app, node_id=node_id, declared=request.declared,
                      bundle_sha256=request.bundle_sha256)
        self._keep(build)
        message = BuildRequest(build_id=build.build_id, app=app, bundle_sha256=request.bundle_sha256,
                               module=request.module, images=request.images, inspect_in=request.inspect_in,
                               locks=[] if request.relock else self._kept_locks(app, request.images),
                               bundle_grant=self._grant(node_id, request.bundle_sha256))
        await self._nc.publish(subjects.node_builds(node_id), encoder.encode(message))
        log.info("build %s of %s asked of node %s", build.build_id[:8], app, node_id)
        return build.view(0)

    def bundles_building_on(self, node_id: str) -> set[str]:
        """The bundles of the builds this control plane asked of ``node_id`` and that are not over: the node may
        read them (``control.node_reads``)."""
        return {b.bundle_sha256 for b in self._builds.values()
                if b.node_id == node_id and b.state in ("queued", "building")}

    def _kept_locks(self, app: str, images: list[ImageSpec]) -> list[ImageSpec]:
        """For each image, the running version's lock of the same declaration, or an empty spec."""
        running = list(self._running(app))
        return [next((lock for lock in running if same_declaration(image, lock)), ImageSpec()) for image in images]

    def view(self, app: str, build_id: str, since: int) -> BuildView:
        build = self._builds.get(build_id)
        if build is None or build.app != app:
            raise NotFoundError(f"no build {build_id[:40]!r} of app {app!r} on this control plane (builds are kept "
                                f"{KEEP_S / 3600:.0f} h by the control plane that started them)")
        if build.state in ("queued", "building") and time.monotonic() - build.heard_at > SILENT_S:
            build.state, build.error = "failed", f"node {build.node_id} said nothing for {SILENT_S:.0f}s"
            build.finished_at = time.time()
        return build.view(since)

    async def _on_event(self, msg: Any) -> None:
        node_id = msg.subject.split(".")[2]
        try:
            event = _event.decode(msg.data)
        except msgspec.DecodeError:
            return
        build = self._builds.get(event.build_id)
        if build is None or build.node_id != node_id or build.state in ("ready", "failed"):
            return  # another control plane's build, or a node speaking for a build it was not asked for
        build.heard_at = time.monotonic()
        if event.state == "ready":
            event = await self._accept(build, event)
        build.state = event.state if event.state != "queued" else "building"
        build.lines.extend(event.lines)
        if len(build.lines) > MAX_LINES:
            cut = len(build.lines) - MAX_LINES
            del build.lines[:cut]
            build.dropped += cut
        if event.state in ("ready", "failed"):
            build.error, build.manifest_json, build.finished_at = event.error, event.manifest_json, time.time()
            log.info("build %s of %s %s", build.build_id[:8], build.app, event.state)

    async def _accept(self, build: Build, event: BuildEvent) -> BuildEvent:
        """The node's final word if its manifest is the declared one as a build may change it, its locks recorded;
        else the build's failure, naming the first field that differs (never the node's manifest)."""
        manifest: Manifest | None = None
        with contextlib.suppress(msgspec.DecodeError):
            manifest = _manifest.decode(event.manifest_json)
        field = "$" if manifest is None or build.declared is None else manifest_difference(build.declared, manifest)
        if manifest is None or field is not None:
            log.warning("build %s of %s: node %s answered a manifest that differs from the one pushed at %s",
                        build.build_id[:8], build.app, build.node_id, field)
            return msgspec.structs.replace(event, state="failed", manifest_json="",
                                           error=f"the node's manifest differs from the one pushed at {field}")
        try:
            await self._record_locks(build.app, manifest)
        except Exception:
            log.exception("build %s of %s: its locks could not be recorded", build.build_id[:8], build.app)
            return msgspec.structs.replace(event, state="failed", manifest_json="",
                                           error="the platform could not record the image's lock: push again")
        return event

    async def _record_locks(self, app: str, manifest: Manifest) -> None:
        """Record every image the build locked for ``app``, which may then deploy it (``image_owned``)."""
        for service in manifest.services:
            if self._owners is not None and service.image is not None and service.image.locked:
                await self._owners.add("image", service.image.sha256, [app])

    def _keep(self, build: Build) -> None:
        now = time.time()
        for old in [b for b in self._builds.values() if b.finished_at and now - b.finished_at > KEEP_S]:
            self._builds.pop(old.build_id, None)
        while len(self._builds) >= MAX_BUILDS:
            self._builds.popitem(last=False)
        self._builds[build.build_id] = build


def _check(request: BuildStart) -> None:
    if len(request.bundle_sha256) != 64 or any(c not in "0123456789abcdef" for c in request.bundle_sha256):
        raise InvalidInputError("a bundle is addressed by its lowercase hex sha256", field="$.bundle_sha256")
    if not MODULE_NAME.fullmatch(request.module) or len(request.module) > 200:
        raise InvalidInputError(f"module {request.module[:80]!r} is not an importable module name", field="$.module")
    if not 1 <= len(request.images) <= MAX_IMAGES:
        raise InvalidInputError(f"a build has 1 to {MAX_IMAGES} images", field="$.images")
    if not 0 <= request.inspect_in < len(request.images):
        raise InvalidInputError("inspect_in is the index of one of the images", field="$.inspect_in")
    for i, image in enumerate(request.images):
        if image.lock or image.sha256:
            raise InvalidInputError("an image to build is declared, not locked: the platform locks it",
                                    field=f"$.images[{i}].lock")
        for path, problem in image_problems(image, f"$.images[{i}]"):
            raise InvalidInputError(problem, field=path)


def _pick(nodes: Mapping[str, NodeInfo], request: BuildStart) -> str:
    """A node that holds the bundle already, else any; at random among equals (the builds spread)."""
    holding = [nid for nid, n in nodes.items() if request.bundle_sha256 in n.bundles]
    return random.choice(holding or list(nodes))


def check_locked(manifest: Any) -> None:
    """A deployment's images are locked (by a build), each named by its hash: 422 naming the field otherwise."""
    for i, service in enumerate(manifest.services):
        image = service.image
        if image is not None and not image.locked:
            raise InvalidInputError("the image is not locked: push with `ember push`, which has the platform lock "
                                    "and build it (POST /v1/apps/<app>/builds) first",
                                    field=f"$.manifest.services[{i}].image.lock")
