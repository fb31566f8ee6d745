"""What the bytecode the node compiles at a push saves a replica that imports a large image's packages.

    python bench/image_bytecode.py [--rounds 5] [--packages torch==2.13.0 transformers==5.25.0]

Builds one environment with the node's own ``EnvCache`` (the real uv; torch's CPU wheel from ``PIP_FIND_LINKS`` /
``UV_FIND_LINKS`` where this machine has it), lists the modules that importing the packages loads (as the build's
manifest read does, ``ember._inspect --modules``), and compiles them with ``ember_runtime.agent.bytecode``, as the
node agent does after a push. Then, interleaved round by round, a fresh interpreter of that environment imports
the packages (``PYTHONDONTWRITEBYTECODE=1``, since a sandbox sees its environment read-only):

- without: ``PYTHONPYCACHEPREFIX`` points at an empty folder, so no bytecode is found (each module compiled in
  memory: what every replica start paid before);
- with: the bytecode the agent compiled, next to the sources.

Prints the medians of wall time and CPU time (user + system) of each import.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

from ember.wire.images import ImageSpec  # noqa: E402
from ember_runtime.agent import bytecode  # noqa: E402
from ember_runtime.agent.envs import EnvCache  # noqa: E402

LIST_MODULES = ("import json, sys\n{imports}\n"
                "print(json.dumps(sorted(f for m in list(sys.modules.values()) "
                "if isinstance(f := getattr(m, '__file__', None), str) and f.endswith('.py'))))")


def _imports(packages: list[str]) -> str:
    return "\n".join(f"import {p.split('==')[0].replace('-', '_')}" for p in packages)


def run_import(python: Path, code: str, env: dict[str, str]) -> tuple[float, float]:
    """Wall and CPU seconds of one interpreter running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run([str(python), "-c", code], check=True, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


async def build(root: Path, packages: list[str]) -> tuple[Path, Path]:
    links = [Path(p) for p in f"{os.environ.get('PIP_FIND_LINKS', '')} {os.environ.get('UV_FIND_LINKS', '')}".split()]
    cache = EnvCache(root / "envs", local_indexes=[p for p in links if p.is_dir()])
    image = ImageSpec(packages=packages, find_links=[str(p) for p in links if p.is_dir()])
    print(f"[bench] locking and building {', '.join(packages)} (uv)", flush=True)
    env = await cache.ensure(await cache.lock(image))
    return env.path, env.python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--packages", nargs="+", default=["torch==2.13.0", "transformers==5.25.0"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ember-bytecode-") as tmp:
        root, python = asyncio.run(build(Path(tmp), args.packages))
        code = _imports(args.packages)
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        base["PYTHONDONTWRITEBYTECODE"] = "1"
        listed = json.loads(subprocess.run([str(python), "-c", LIST_MODULES.format(imports=code)], check=True,
                                           env=base, capture_output=True, text=True).stdout)
        started = time.perf_counter()
        compiled = asyncio.run(bytecode.compile_imported(root, python, listed))
        compile_s = time.perf_counter() - started
        print(f"[bench] {len(listed)} modules loaded, {compiled} in the environment compiled in {compile_s:.1f}s",
              flush=True)
        empty = Path(tmp) / "no-bytecode"
        empty.mkdir()
        variants = {"without bytecode": {**base, "PYTHONPYCACHEPREFIX": str(empty)}, "with the node's bytecode": base}
        seen: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        run_import(python, code, base)  # the page cache warm for both
        for i in range(args.rounds):
            for name, env in variants.items():
                seen[name].append(run_import(python, code, env))
            print(f"[bench] round {i + 1}/{args.rounds}", flush=True)
    print(f"\n`{code.replace(chr(10), '; ')}` in a fresh interpreter, {args.rounds} interleaved rounds, medians\n")
    print("| imports | wall s | CPU s |")
    print("|---|---:|---:|")
    for name, values in seen.items():
        print(f"| {name} | {statistics.median(v[0] for v in values):.2f} | "
              f"{statistics.median(v[1] for v in values):.2f} |")
    print(f"\ncompiling the {compiled} modules once, at the push: {compile_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
