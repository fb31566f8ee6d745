"""Bytecode for what an app imports from its image, compiled by the node agent after the build reads its manifest.

A sandbox sees its environment read-only, so Python can never cache the bytecode of what a replica imports from
it: every start compiled every module it imported again (torch and transformers: 7.8 s of CPU to import without
their bytecode, 3.4 s with it, on a 2-core guest). Compiling a whole environment at build (uv's
``--compile-bytecode``) costs more than it saves for a large image (torch and transformers: 9,560 modules, and a
build of 84 s instead of 7.6 s on the same guest). So the agent compiles what the app's own import inside its image
loaded (the build's manifest read: ``python -m ember._inspect --modules``), which is what every replica of the app
imports before its setup runs.

The list comes from a process that runs the app's code, so it only selects: each path must name a regular ``.py``
file inside the environment once every link in it is followed, and the agent compiles them itself, with the
environment's interpreter started isolated (``-I -S``: no ``site``, so no package's ``.pth`` file runs), which parses
each source and never runs it. Nothing a sandbox writes is ever read as bytecode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

log = logging.getLogger("ember.agent")
MAX_FILES = 20_000
COMPILE_TIMEOUT_S = 300.0


def selected(root: Path, paths: Iterable[object]) -> list[Path]:
    """The paths among ``paths`` that are regular ``.py`` files inside ``root`` (links followed), each once."""
    inside = root.resolve()
    found: set[Path] = set()
    for raw in paths:
        if len(found) >= MAX_FILES:
            break
        if not isinstance(raw, str) or not raw.endswith(".py") or "\0" in raw or "\n" in raw \
                or not raw.startswith("/"):
            continue
        try:
            real = Path(raw).resolve(strict=True)
        except (OSError, RuntimeError):
            continue
        if real.is_relative_to(inside) and real.suffix == ".py" and real.is_file():
            found.add(real)
    return sorted(found)


async def compile_imported(root: Path, python: Path, paths: Iterable[object]) -> int:
    """Compile the bytecode of the selected ``paths`` (see ``selected``) into the environment at ``root`` with its
    interpreter ``python``; how many files were asked. Never raises: a replica without the bytecode compiles it in
    memory, as before."""
    files = selected(root, paths)
    if not files:
        return 0
    try:
        proc = await asyncio.create_subprocess_exec(
            str(python), "-I", "-S", "-m", "compileall", "-q", "-i", "-", stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE, env={"PATH": os.defpath},
            cwd=root, preexec_fn=_lower_priority)
    except OSError as exc:
        log.warning("cannot compile the bytecode of environment %s: %s", root.name[:12], exc)
        return 0
    try:
        _, err = await asyncio.wait_for(proc.communicate("\n".join(map(str, files)).encode() + b"\n"),
                                        COMPILE_TIMEOUT_S)
    except BaseException as exc:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        if not isinstance(exc, TimeoutError):
            raise
        log.warning("compiling environment %s's bytecode took over %.0fs: stopped", root.name[:12],
                    COMPILE_TIMEOUT_S)
        return len(files)
    if proc.returncode:  # a module that does not compile: its importer would fail on it too
        log.info("compiling environment %s's bytecode: %s", root.name[:12],
                 err.decode(errors="replace").strip()[-300:])
    return len(files)


def _lower_priority() -> None:
    with contextlib.suppress(OSError):
        os.nice(10)
