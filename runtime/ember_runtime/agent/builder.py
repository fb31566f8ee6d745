"""Builds at push time: a control plane asks this node (``ember.node.<id>.build``) to lock an app's images, build
their environments, and read the app's manifest by importing it inside its image, in a sandbox like a replica's.

The node says how it goes on ``ember.node.<id>.build-events`` (uv's output, line by line, then the end: the
manifest with its images locked, or the error). The pushing machine never imports the app with its own Python, so
it needs none of the packages the image installs.

The import is the pushing tenant's code run on a node that other tenants' replicas share: besides the sandbox, it
may use ``--build-memory-mb`` of memory (a cgroup's ``memory.max`` where the node delegates the memory controller,
else the data segment's rlimit, ``RLIMIT_DATA``, which counts what it allocates), and it is the first process the
kernel's OOM killer picks (``oom_score_adj`` 1000) should the node run short before that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import msgspec

from ember.wire import Manifest, encoder, subjects
from ember.wire.images import BUILD_ID, MAX_LOG_LINE, SHA256, BuildEvent, BuildRequest, ImageSpec, same_declaration
from ember.wire.validate import APP_NAME, MODULE_NAME, manifest_problems
from ember_runtime.agent import bytecode
from ember_runtime.agent import sandbox as sandboxes
from ember_runtime.agent.cgroups import MemoryCgroups
from ember_runtime.agent.envs import BuildError, Env, EnvCache

log = logging.getLogger("ember.agent")
INSPECT_TIMEOUT_S = 300.0
MAX_MANIFEST_BYTES = 2 * 1024 * 1024
MAX_CONCURRENT = 2
MEMORY_MB = 8192  # what a build's import may use by default (``--build-memory-mb``)
OOM_FIRST = 1000  # oom_score_adj: the import is the first process the OOM killer picks
FLUSH_S = 0.2
_request = msgspec.json.Decoder(BuildRequest)
_manifest = msgspec.json.Decoder(Manifest)


class Builder:
    def __init__(self, nc: Any, node_id: str, cache: EnvCache, bundles: Any,
                 sandbox: sandboxes.Sandbox = sandboxes.NO_SANDBOX, *, memory_mb: int = MEMORY_MB,
                 cgroups: Callable[[], MemoryCgroups | None] = lambda: None) -> None:
        """``memory_mb``: what an import may use (0: no limit); ``cgroups``: the node's memory cgroups, if any."""
        self._nc = nc
        self._node_id = node_id
        self._cache = cache
        self._bundles = bundles
        self._sandbox = sandbox
        self._memory_mb = memory_mb
        self._cgroups = cgroups
        self._sub: Any = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._slots = asyncio.Semaphore(MAX_CONCURRENT)

    async def start(self) -> None:
        builds = subjects.node_builds(self._node_id)
        self._sub = await self._nc.subscribe(builds, cb=subjects.only_on(builds, self._on_request))

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _on_request(self, msg: Any) -> None:
        try:
            request = _request.decode(msg.data)
        except msgspec.DecodeError as exc:
            log.warning("a build request that is not one: %s", exc)
            return
        if not BUILD_ID.fullmatch(request.build_id):
            log.warning("a build request with a malformed id")
            return
        task = asyncio.get_running_loop().create_task(self._run(request), name=f"build-{request.build_id[:8]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, request: BuildRequest) -> None:
        out = _Events(self._nc, self._node_id, request.build_id)
        flusher = asyncio.get_running_loop().create_task(out.run())
        try:
            async with self._slots:
                manifest = await self._build(request, out.say)
            out.finish(BuildEvent(build_id=request.build_id, state="ready",
                                  manifest_json=encoder.encode(manifest).decode()))
        except BuildError as exc:
            out.finish(BuildEvent(build_id=request.build_id, state="failed", error=str(exc)[:8000]))
        except Exception as exc:
            log.exception("build %s failed", request.build_id[:8])
            out.finish(BuildEvent(build_id=request.build_id, state="failed", error=f"{type(exc).__name__}: {exc}"))
        finally:
            if not out.finished:  # cancelled (the agent stops): nothing more to say
                flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)

    async def _build(self, request: BuildRequest, say: Any) -> Manifest:
        _check(request)
        locked: list[ImageSpec] = []
        envs: list[Env] = []
        for i, image in enumerate(request.images):
            say(f"image {i + 1}/{len(request.images)}: {', '.join(image.packages) or 'no packages'}")
            kept = request.locks[i] if i < len(request.locks) else None
            if kept is not None and same_declaration(image, kept):  # the running version's: what runs now
                locked.append(msgspec.structs.replace(kept, env=image.env))
                say(f"the image did not change: keeping the running version's lock {kept.sha256[:12]} "
                    "(`ember push --relock` resolves it again)")
            else:
                locked.append(await self._cache.lock(image, say))
            say(f"locked as {locked[-1].sha256[:12]}: " + ", ".join(
                line.split(" ")[0] for line in locked[-1].lock.splitlines() if "==" in line))
            envs.append(await self._cache.ensure(locked[-1], say))
        say(f"fetching bundle {request.bundle_sha256[:12]}")
        self._bundles.allow(request.bundle_sha256, request.bundle_grant)  # any control plane answers its read
        bundle = await self._bundles.get(request.bundle_sha256)
        say(f"importing {request.module} inside its image to read its manifest")
        image, env = locked[request.inspect_in], envs[request.inspect_in]
        raw, loaded = (await self._inspect(bundle, request, env, image)).partition(b"\n")[::2]
        manifest = _with_locks(_decode(raw), request, locked)
        compiled = await bytecode.compile_imported(env.path, env.python, _module_files(loaded))
        log.info("compiled the bytecode of %d modules %s imports from environment %s", compiled, request.app,
                 env.sha256[:12])
        if compiled:
            say(f"compiled the bytecode of the {compiled} modules {request.module} imports from its image")
        return manifest

    async def _inspect(self, bundle: Path, request: BuildRequest, env: Env, image: ImageSpec) -> bytes:
        """``python -m ember._inspect`` with the image's interpreter, in a sandbox as a replica's (no credentials)."""
        enabled = self._sandbox.enabled
        root = sandboxes.BUNDLE if enabled else str(bundle)
        app_file = f"{root}/{request.module.replace('.', '/')}.py"
        command = [str(env.python), "-m", "ember._inspect", "--modules", app_file, request.app]
        variables = sandboxes.environment(dict(image.env), sandboxed=enabled)
        groups = self._cgroups() if self._memory_mb > 0 else None
        group = groups.prepare(f"build-{request.build_id[:16]}", self._memory_mb) if groups else None
        preexec = partial(_import_child, MemoryCgroups.joiner(group), 0 if group else self._memory_mb)
        proc: Any
        try:
            if enabled:
                jail = sandboxes.Jail(bundle=bundle, readonly=env.readonly)
                proc = await sandboxes.start(self._sandbox, command, jail, variables, preexec)
            else:
                proc = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE, cwd=bundle, env=variables, start_new_session=True,
                    preexec_fn=preexec)
            try:
                out, err = await asyncio.wait_for(asyncio.gather(_read_up_to(proc.stdout, MAX_MANIFEST_BYTES),
                                                                 _read_up_to(proc.stderr, 64 * 1024)),
                                                  INSPECT_TIMEOUT_S)
                code = await proc.wait()
            except BaseException:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    proc.send_signal(9)
                await proc.wait()
                raise
        finally:
            await MemoryCgroups.end(group, within_s=5.0)
        if code != 0:
            text = err.decode(errors="replace").strip()
            raise BuildError(f"importing {request.module} inside its image failed:\n{text[-4000:] or f'exit {code}'}"
                             + self._memory_note(text, code))
        return bytes(out)

    def _memory_note(self, text: str, code: int) -> str:
        """Why an import that ran out of its memory failed (a ``MemoryError`` under the rlimit, SIGKILL in a cgroup)."""
        if self._memory_mb <= 0 or not ("MemoryError" in text or code in (-9, 137)):
            return ""
        return (f"\n(an app's import at push time may use {self._memory_mb} MiB of memory on the node that builds it: "
                "load large weights in an @ember.setup method, which runs in the replica)")


def _import_child(join_cgroup: Callable[[], None] | None, data_mb: int) -> None:
    """Between fork and exec of a build's import: what a replica's child gets (``prepare_child``), its memory cgroup
    where there is one, else ``data_mb`` MiB of data segment (``RLIMIT_DATA``: what it allocates, mapped or not), and
    the OOM killer's first pick."""
    sandboxes.prepare_child(None, cgroup=join_cgroup)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(OOM_FIRST))
    if data_mb > 0:
        limit = data_mb * 1024 * 1024
        with contextlib.suppress(ValueError, OSError):
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            limit = limit if hard == resource.RLIM_INFINITY else min(limit, hard)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))


def _check(request: BuildRequest) -> None:
    if not APP_NAME.fullmatch(request.app) or not SHA256.fullmatch(request.bundle_sha256) \
            or not MODULE_NAME.fullmatch(request.module) or len(request.module) > 200:
        raise BuildError("the build request names no valid app, bundle or module")
    if not 1 <= len(request.images) <= 16 or not 0 <= request.inspect_in < len(request.images):
        raise BuildError("a build locks 1 to 16 images and imports the app in one of them")


async def _read_up_to(stream: Any, limit: int) -> bytes:
    """What ``stream`` gives until it ends, at most ``limit`` bytes (the rest is read and dropped, so that the
    process never blocks on a full pipe). One ``read(limit)`` returns as soon as anything came: a manifest larger
    than the pipe's buffer came cut."""
    kept = bytearray()
    while chunk := await stream.read(64 * 1024):
        kept += chunk[:max(limit - len(kept), 0)]
    return bytes(kept)


def _module_files(raw: bytes) -> list[object]:
    """The files of the modules the app's import loaded from its image, as ``ember._inspect --modules`` says
    (written by the app's process: ``bytecode.selected`` checks each); none if it said nothing sensible."""
    try:
        files = msgspec.json.decode(raw.strip() or b"[]")
    except msgspec.DecodeError:
        return []
    return files if isinstance(files, list) else []


def _decode(raw: bytes) -> Manifest:
    try:
        return _manifest.decode(raw)
    except msgspec.DecodeError as exc:
        raise BuildError(f"the app's manifest, read inside its image, is not one: {exc}") from exc


def _with_locks(manifest: Manifest, request: BuildRequest, locked: list[ImageSpec]) -> Manifest:
    """The manifest with each service's image replaced by its lock (its own environment variables kept)."""
    if manifest.app != request.app or manifest.module != request.module:
        raise BuildError(f"the file defines app {manifest.app!r}, not {request.app!r}")
    by_declared = {_key(d): lock for d, lock in zip(request.images, locked, strict=True)}
    services = []
    for service in manifest.services:
        if service.image is None:
            services.append(service)
            continue
        lock = by_declared.get(_key(service.image))
        if lock is None:
            raise BuildError(f"service {service.name}: its image is not the one declared when the app was read on "
                             "the pushing machine (does it depend on a package only the image has?)")
        services.append(msgspec.structs.replace(service, image=msgspec.structs.replace(lock, env=service.image.env)))
    result = msgspec.structs.replace(manifest, services=services)
    for field, problem in manifest_problems(result, "$"):
        raise BuildError(f"the manifest read inside the image: {field}: {problem}")
    return result


def _key(image: ImageSpec) -> bytes:
    return encoder.encode(image.declared())


class _Events:
    """A build's log lines, published in small batches; then its end."""

    def __init__(self, nc: Any, node_id: str, build_id: str) -> None:
        self._nc = nc
        self._subject = subjects.node_build_events(node_id)
        self._id = build_id
        self._lines: list[str] = []
        self._end: BuildEvent | None = None
        self._wake = asyncio.Event()

    def say(self, line: str) -> None:
        self._lines.append(line[:MAX_LOG_LINE])
        if len(self._lines) >= 50:
            self._wake.set()

    @property
    def finished(self) -> bool:
        return self._end is not None

    def finish(self, event: BuildEvent) -> None:
        self._end = event
        self._wake.set()

    async def run(self) -> None:
        last = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), FLUSH_S)
            self._wake.clear()
            lines, self._lines = self._lines, []
            if lines or time.monotonic() - last > 5.0:  # a heartbeat while uv is quiet: the build is alive
                await self._publish(BuildEvent(build_id=self._id, lines=lines))
                last = time.monotonic()
            if self._end is not None:
                await self._publish(self._end)
                return

    async def _publish(self, event: BuildEvent) -> None:
        with contextlib.suppress(Exception):
            await self._nc.publish(self._subject, encoder.encode(event))
