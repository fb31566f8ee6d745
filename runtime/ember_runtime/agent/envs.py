"""Image environments on a node: locked with ``uv pip compile``, built with ``uv`` into a content-addressed cache,
each once per node, shared by every replica and zygote of every version whose lock is the same.

Layout of the cache (``<state dir>/envs``, written by the agent alone; sandboxes see an environment read-only):

| path | what |
| --- | --- |
| ``<sha256>/`` | one environment (a virtual environment), named by ``image_hash`` of its locked image |
| ``<sha256>/.ember-ready`` | written last: an environment without it is unfinished and built again |
| ``<sha256>/.ember-build.log`` | uv's output of its build |
| ``runtime/<key>/`` | Ember's runtime layer: ``ember``, ``ember_runtime`` and their dependencies, linked |
| ``uv-cache/`` | uv's download and wheel cache, shared by every build of the node; counted in the budget |
| ``builds.log`` | one line per environment built: its hash and how long it took |

**Wheels only.** Locking and building run in the agent, outside any sandbox, so they never build a source
distribution (``--no-build``: building one runs the package's own code): a requirement without a wheel for the
node's platform fails the lock, with uv's message naming it.

**Ember's runtime inside an app's environment.** A replica runs ``python -m ember_runtime.replica`` with the
environment's interpreter, so the environment needs Ember and what Ember imports (msgspec, nats-py, uvloop).
They are not installed into it: the node's own copies are linked into a *runtime layer* folder and a ``.pth`` file
in the environment's site-packages adds that folder at the end of ``sys.path``. The app's own packages come first;
its requirements are resolved with the node's versions of Ember's dependencies as constraints, so a pin that
would break Ember (``msgspec<0.18``) fails the lock, naming both, at push time, and an app that needs one of them
gets the very same version. An image on another Python version than the node's cannot load the node's compiled
dependencies: there Ember's dependencies are resolved and installed into the environment as requirements, and
the layer holds only Ember's own (pure Python) packages.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata as metadata
import json
import logging
import os
import re
import shutil
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec

import ember
import ember_runtime
from ember.wire.images import SHA256, ImageSpec, image_hash, image_problems
from ember_runtime.agent.bundles import folder_size
from ember_runtime.agent.envfiles import VENV_CFG, base_prefix, home_of, site_packages, write_own

log = logging.getLogger("ember.agent")

LOCAL_INDEXES_ENV = "EMBER_IMAGE_LOCAL_INDEXES"  # folders (':'-separated) whose wheels images may install from
BUDGET_ENV = "EMBER_NODE_ENV_CACHE_BYTES"
DEFAULT_BUDGET = 20 * 1024**3
UV_CACHE = "uv-cache"  # uv's own cache, under the environments' folder
RUNTIME_DISTS = ("msgspec", "nats-py", "uvloop")  # what ember and ember_runtime import in a replica
READY = ".ember-ready"
BUILD_LOG = ".ember-build.log"
LOCK_TIMEOUT_S = 300.0
BUILD_TIMEOUT_S = 1800.0
Say = Callable[[str], Awaitable[None] | None]


class BuildError(Exception):
    """An image could not be locked or built; the message says why (uv's own words, naming the package)."""


@dataclass(frozen=True)
class Env:
    """A built environment: its interpreter and what a sandbox must see of the node to run it."""

    sha256: str
    path: Path
    python: Path  # <path>/bin/python
    readonly: tuple[Path, ...]  # bound read-only in a sandbox: the environment, the runtime layer, its base Python


def node_python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def uv_binary() -> str:
    """The ``uv`` the ``uv`` package ships (beside this interpreter), else one on PATH."""
    with contextlib.suppress(ImportError, FileNotFoundError):
        import uv

        return str(uv.find_uv_bin())
    found = shutil.which("uv")
    if found is None:
        raise BuildError("uv is not installed on this node: `pip install uv`")
    return found


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_distributions() -> dict[str, metadata.Distribution]:
    """Ember's runtime dependencies as installed here, with what they require in turn (extras left out)."""
    found: dict[str, metadata.Distribution] = {}
    todo = list(RUNTIME_DISTS)
    while todo:
        name = _normal(todo.pop())
        if name in found:
            continue
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found[name] = dist
        for requirement in dist.requires or []:
            if "extra ==" not in requirement:
                todo.append(re.split(r"[\s\[<>=!~;(]", requirement.strip(), maxsplit=1)[0])
    return found


def runtime_constraints() -> list[str]:
    """``name==version`` of each of Ember's runtime dependencies as installed on this node."""
    return sorted(f"{name}=={dist.version}" for name, dist in runtime_distributions().items())


def runtime_requirements() -> list[str]:
    """Ember's runtime dependencies as requirements, for an environment on another Python version."""
    return sorted(f"{name}>={dist.version.split('.')[0]}.0" if name != "msgspec" else f"msgspec>={dist.version}"
                  for name, dist in runtime_distributions().items())


def _top_levels(dist: metadata.Distribution) -> set[Path]:
    """The top-level files and folders a distribution installed (its modules and its .dist-info)."""
    tops: set[Path] = set()
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts and parts[0] not in ("..", "__pycache__") and not parts[0].endswith(".data"):
            tops.add(Path(str(dist.locate_file(parts[0]))))
    return tops


class RuntimeLayer:
    """A folder of links to Ember's own packages (and, for environments on the node's Python, to its
    dependencies as this node has them): what an environment's ``.pth`` adds to ``sys.path``."""

    def __init__(self, root: Path) -> None:
        self._root = root

    def path(self, with_dependencies: bool) -> Path:
        links = self._links(with_dependencies)
        key = hashlib.sha256(json.dumps(sorted((k, str(v)) for k, v in links.items())).encode()).hexdigest()[:16]
        folder = self._root / key
        if not folder.is_dir():
            tmp = self._root / f".{key}.{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            for name, target in links.items():
                (tmp / name).symlink_to(target)
            with contextlib.suppress(OSError):
                tmp.rename(folder)
            shutil.rmtree(tmp, ignore_errors=True)
        return folder

    def targets(self, with_dependencies: bool) -> tuple[Path, ...]:
        """What the links point at (a sandbox binds them read-only at the same paths)."""
        return tuple(sorted({p.parent for p in self._links(with_dependencies).values()}))

    @staticmethod
    def _links(with_dependencies: bool) -> dict[str, Path]:
        links = {"ember": Path(ember.__file__).parent.resolve(),
                 "ember_runtime": Path(ember_runtime.__file__).parent.resolve()}
        if with_dependencies:
            for dist in runtime_distributions().values():
                for top in _top_levels(dist):
                    if top.exists():
                        links.setdefault(top.name, top.resolve())
        return links


class EnvCache:
    """The node's environments: locked, built once each (concurrent starts wait for the one build), collected
    least recently used first under a disk budget, never while in use."""

    def __init__(self, root: Path, *, budget_bytes: int | None = None,
                 local_indexes: Sequence[Path] | None = None) -> None:
        self.root = root
        self.budget = budget_bytes if budget_bytes is not None else int(os.environ.get(BUDGET_ENV, DEFAULT_BUDGET))
        raw = os.environ.get(LOCAL_INDEXES_ENV, "") if local_indexes is None else ""
        self.local_indexes = tuple(Path(p).resolve() for p in (local_indexes or raw.split(":")) if str(p).strip())
        self.layer = RuntimeLayer(root / "runtime")
        self._building: dict[str, asyncio.Task[Env]] = {}
        self._used: dict[str, float] = {}
        self.builds = 0  # environments this process built (not found ready)

    # ---- locking

    async def lock(self, image: ImageSpec, say: Say | None = None) -> ImageSpec:
        """The image locked: every distribution pinned and hashed, resolved on this node, with Ember's
        runtime dependencies as constraints (or requirements, on another Python), named by its hash."""
        self._check(image)
        python = image.python or node_python()
        same = python == node_python()
        declared = msgspec.structs.replace(image.declared(), python=python)
        wanted = [*image.packages, *([] if same else runtime_requirements())]
        self.root.mkdir(parents=True, exist_ok=True)
        # one file per lock: two builds lock at once on a node (a file per process was unlinked under the other)
        fd, name = tempfile.mkstemp(prefix=".constraints-", suffix=".txt", dir=self.root)
        constraints = Path(name)
        with os.fdopen(fd, "w") as written:
            written.write("\n".join(runtime_constraints()) + "\n")
        await _say(say, f"resolving {len(image.packages)} requirement(s) for Python {python} with uv")
        argv = [uv_binary(), "pip", "compile", "-", "--python-version", python, "--generate-hashes", "--no-header",
                "--no-annotate", "--quiet", "--no-build", *(["-c", str(constraints)] if same else []),
                *self._index_args(image)]
        try:
            code, out, err = await self._uv(argv, stdin="\n".join(wanted) + "\n", timeout_s=LOCK_TIMEOUT_S, say=say)
        finally:
            constraints.unlink(missing_ok=True)
        if code != 0:
            raise BuildError(_resolution_error(err, image.packages))
        locked = msgspec.structs.replace(declared, lock=out, env=image.env)
        return msgspec.structs.replace(locked, sha256=image_hash(locked))

    # ---- building

    async def ensure(self, image: ImageSpec, say: Say | None = None) -> Env:
        """The environment of a locked image, built here first if this node has none (once: concurrent callers
        wait for the same build)."""
        self._check(image, locked=True)
        sha = image.sha256
        self._used[sha] = time.time()
        ready = self._ready(sha, image)
        if ready is not None:
            return ready
        task = self._building.get(sha)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._build(image, say), name=f"env-{sha[:12]}")
            self._building[sha] = task
            task.add_done_callback(lambda _t: self._building.pop(sha, None))
        elif say is not None:
            await _say(say, f"environment {sha[:12]} is being built for another start; waiting for it")
        return await asyncio.shield(task)

    def _ready(self, sha: str, image: ImageSpec) -> Env | None:
        folder = self.root / sha
        if not (folder / READY).is_file() or base_prefix(folder / READY) is None:
            return None
        with contextlib.suppress(OSError):
            os.utime(folder / READY)  # last use: the collector goes least recently used first
        return self._env(folder, image)

    def _env(self, folder: Path, image: ImageSpec) -> Env:
        same = image.python == node_python()
        python = folder / "bin" / "python"
        base = base_prefix(folder / READY)
        readonly = (folder, self.layer.path(same), *self.layer.targets(same), *([base] if base else []))
        return Env(sha256=folder.name, path=folder, python=python, readonly=tuple(dict.fromkeys(readonly)))

    async def _build(self, image: ImageSpec, say: Say | None) -> Env:
        sha = image.sha256
        folder = self.root / sha
        shutil.rmtree(folder, ignore_errors=True)  # an unfinished build of before
        started = time.monotonic()
        await _say(say, f"building environment {sha[:12]} (Python {image.python}, "
                        f"{image.lock.count('==')} distributions)")
        same = image.python == node_python()
        self.root.mkdir(parents=True, exist_ok=True)  # a node's first environment
        lock_file = self.root / f".lock-{sha}.txt"
        lock_file.write_text(image.lock)
        log_lines: list[str] = []

        async def keep(line: str) -> None:
            log_lines.append(line)
            await _say(say, line)

        try:
            interpreter = _base_python() if same else image.python
            cfg = ""  # as uv venv wrote it, before any package could install a file of that name (``envfiles``)
            for argv in ([uv_binary(), "venv", "--python", interpreter, "--no-project", str(folder)],
                         [uv_binary(), "pip", "sync", "--python", str(folder / "bin" / "python"), "--require-hashes",
                          "--no-build", *self._index_args(image), str(lock_file)]):
                code, _, err = await self._uv(argv, timeout_s=BUILD_TIMEOUT_S, say=keep)
                if code != 0:
                    raise BuildError(f"building environment {sha[:12]} failed: {_tail(err)}")
                cfg = cfg or (folder / VENV_CFG).read_text()
            write_own(folder / VENV_CFG, cfg)
            site = _site_packages(folder)
            write_own(site / "_ember_runtime.pth", f"{self.layer.path(same)}\n")
            write_own(folder / BUILD_LOG, "\n".join(log_lines) + "\n")
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        finally:
            lock_file.unlink(missing_ok=True)
        took = time.monotonic() - started
        write_own(folder / READY, json.dumps({"sha256": sha, "python": image.python, "build_s": round(took, 3),
                                              "built_at": time.time(), "home": home_of(cfg)}))
        with (self.root / "builds.log").open("a") as f:
            f.write(f"{sha} {took:.3f}\n")
        self.builds += 1
        await _say(say, f"environment {sha[:12]} built in {took:.1f}s")
        log.info("built environment %s in %.1fs", sha[:12], took)
        return self._env(folder, image)

    # ---- the cache

    def cached(self) -> list[str]:
        """The environments ready on this node, by hash."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if SHA256.fullmatch(p.name) and (p / READY).is_file())

    def collect(self, in_use: Iterable[str]) -> list[str]:
        """Remove environments least recently used first until the cache is within its budget; never one in
        ``in_use`` or being built. Returns the hashes removed."""
        keep = set(in_use) | set(self._building)
        sizes = {sha: folder_size(self.root / sha) for sha in self.cached()}
        total = sum(sizes.values())
        removed: list[str] = []
        by_age = sorted(sizes, key=lambda sha: _mtime(self.root / sha / READY))
        for sha in by_age:
            if total <= self.budget:
                break
            if sha in keep:
                continue
            (self.root / sha / READY).unlink(missing_ok=True)  # unfinished from here on: never used half-removed
            shutil.rmtree(self.root / sha, ignore_errors=True)
            total -= sizes[sha]
            removed.append(sha)
            log.info("removed environment %s (%d MB) to keep the cache within %d MB", sha[:12], sizes[sha] >> 20,
                     self.budget >> 20)
        return removed

    async def collect_uv_cache(self) -> bool:
        """uv's download cache (``uv-cache``: wheels and their unpacked trees, which built environments no longer
        need) counted with the environments against the same budget, each file once (an environment's files are
        hard links into it): when over, ``uv cache prune`` drops what nothing refers to, and if that is not
        enough ``uv cache clean`` drops the rest (a later build downloads again). Never while a build runs (uv
        would wait on its own lock). True when it cleaned."""
        cache = self.root / UV_CACHE
        if self._building or not cache.is_dir():
            return False
        folders = [cache, *(self.root / sha for sha in self.cached())]
        before = await asyncio.to_thread(unique_bytes, folders)
        if before <= self.budget:
            return False
        after = before
        for command in (["cache", "prune"], ["cache", "clean"]):
            if self._building:
                break
            code, _, err = await self._uv([uv_binary(), *command, "--cache-dir", str(cache)], timeout_s=LOCK_TIMEOUT_S)
            if code:
                log.warning("uv %s failed: %s", " ".join(command), _tail(err, 3))
                break
            after = await asyncio.to_thread(unique_bytes, folders)
            if after <= self.budget:
                break
        log.info("uv's cache cut from %d MB to %d MB (environments and cache within %d MB)", before >> 20,
                 after >> 20, self.budget >> 20)
        return True

    # ---- helpers

    def _check(self, image: ImageSpec, *, locked: bool = False) -> None:
        """Everything of the image checked again here: a node trusts nothing it is sent."""
        for field, problem in image_problems(image, "image"):
            raise BuildError(f"{field}: {problem}")
        if locked and not (image.locked and SHA256.fullmatch(image.sha256)):
            raise BuildError("the image is not locked: push the app again")
        for link in image.find_links:
            if link.startswith("/") and not self._local_allowed(Path(link)):
                raise BuildError(f"find_links {link!r}: this node installs from no local folder there (its operator "
                                 f"allows local folders in {LOCAL_INDEXES_ENV})")

    def _local_allowed(self, folder: Path) -> bool:
        real = folder.resolve()
        return any(real == root or real.is_relative_to(root) for root in self.local_indexes) and real.is_dir()

    @staticmethod
    def _index_args(image: ImageSpec) -> list[str]:
        args = ["--no-index"] if image.no_index else []
        if image.index_url and not image.no_index:
            args += ["--index-url", image.index_url]
        for url in image.extra_index_urls if not image.no_index else []:
            args += ["--extra-index-url", url]
        for link in image.find_links:
            args += ["--find-links", str(Path(link).resolve()) if link.startswith("/") else link]
        return args

    async def _uv(self, argv: list[str], *, timeout_s: float, stdin: str | None = None,
                  say: Say | None = None) -> tuple[int, str, str]:
        """Run uv (its cache the node's), its stderr passed on line by line; (exit code, stdout, stderr)."""
        # hard links into the cache (or copies), never symlinks: cleaning the cache must not break an environment
        env = {**os.environ, "UV_CACHE_DIR": str(self.root / UV_CACHE), "UV_LINK_MODE": "hardlink", "NO_COLOR": "1"}
        env.pop("VIRTUAL_ENV", None)
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=env, cwd=self.root)
        assert proc.stdout is not None and proc.stderr is not None
        if stdin is not None and proc.stdin is not None:
            proc.stdin.write(stdin.encode())
            await proc.stdin.drain()
            proc.stdin.close()
        errors: list[str] = []

        async def pump() -> None:
            assert proc.stderr is not None
            async for raw in proc.stderr:
                line = raw.decode(errors="replace").rstrip()
                if line:
                    errors.append(line)
                    await _say(say, line)

        try:
            out, _ = await asyncio.wait_for(asyncio.gather(proc.stdout.read(), pump()), timeout_s)
            code = await proc.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise
        return code, out.decode(errors="replace"), "\n".join(errors)


async def _say(say: Say | None, line: str) -> None:
    if say is None:
        return
    result = say(line)
    if result is not None:
        await result


def _tail(text: str, lines: int = 12) -> str:
    return "\n".join(text.strip().splitlines()[-lines:]) or "no output"


def _resolution_error(err: str, packages: list[str]) -> str:
    """uv's reason, with the requirement it names first (uv says 'Because there is no version of X==3.0 ...')."""
    names = [re.split(r"[\s\[<>=!~;(]", p, maxsplit=1)[0] for p in packages]
    named = [n for n in names if re.search(rf"\b{re.escape(n)}\b", err, re.IGNORECASE)]
    head = f"cannot resolve {', '.join(named)}: " if named else "cannot resolve the image's requirements: "
    return head + _tail(err)


def unique_bytes(folders: Iterable[Path]) -> int:
    """Bytes of the files under ``folders`` (as ``folder_size`` counts them), a file with several hard links among
    them counted once."""
    seen: set[tuple[int, int]] = set()
    total = 0
    for folder in folders:
        for dirpath, _, files in os.walk(folder):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(dirpath, name))
                    if (st.st_dev, st.st_ino) not in seen:
                        seen.add((st.st_dev, st.st_ino))
                        total += st.st_size
    return total


def _base_python() -> str:
    """This agent's base interpreter (an environment made from a virtual environment's would point at it)."""
    return getattr(sys, "_base_executable", "") or sys.executable


def _site_packages(folder: Path) -> Path:
    found = site_packages(folder)
    if found is None:
        raise BuildError(f"environment {folder.name[:12]} has no site-packages")
    return found


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
