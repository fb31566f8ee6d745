"""The dependency direction is a contract: checked in fresh interpreters by looking at ``sys.modules``."""

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]

_LOADED = """
import importlib, json, pkgutil, sys
for name in {imports!r}:
    module = importlib.import_module(name)
    if {walk!r} and hasattr(module, "__path__"):
        for info in pkgutil.walk_packages(module.__path__, name + "."):
            if not info.name.endswith("__main__"):
                importlib.import_module(info.name)
print(json.dumps(sorted(sys.modules)))
"""


def _loaded_modules(*imports: str, walk: bool = False) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _LOADED.format(imports=list(imports), walk=walk)],
                          capture_output=True, text=True, timeout=120, check=False, cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    return set(json.loads(proc.stdout))


def _roots(modules: set[str]) -> set[str]:
    return {name.partition(".")[0] for name in modules}


def test_import_ember_stays_light() -> None:
    heavy = {"torch", "nats", "starlette", "uvicorn", "httpx", "jsonschema", "ember_platform", "ember_runtime"}
    assert _roots(_loaded_modules("ember")) & heavy == set()


def test_probe_sees_what_it_imports() -> None:
    # The check above would pass vacuously if the probe could not see an import.
    assert "json" in _roots(_loaded_modules("ember", "json"))


@pytest.mark.parametrize(("package", "forbidden"), [
    ("ember_platform", "ember_runtime"),
    ("ember_runtime", "ember_platform"),
])
def test_platform_and_runtime_never_import_each_other(package: str, forbidden: str) -> None:
    roots = _roots(_loaded_modules(package, walk=True))
    assert package in roots
    assert "ember" in roots
    assert forbidden not in roots


def test_runtime_does_not_load_torch() -> None:
    assert "torch" not in _roots(_loaded_modules("ember_runtime", walk=True))


def test_stdlib_platform_is_not_shadowed_from_the_repo_root() -> None:
    code = ("import platform, uuid, sys; platform.system(); uuid.uuid4(); "
            "assert sys.path[0] == '', sys.path; print(platform.__file__)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False,
                          cwd=REPO_ROOT)
    assert proc.returncode == 0, proc.stderr
    assert not Path(proc.stdout.strip()).resolve().is_relative_to(REPO_ROOT)


@pytest.mark.parametrize("folder", ["platform", "runtime", "sdk"])
def test_source_roots_are_not_packages(folder: str) -> None:
    root = REPO_ROOT / folder
    assert root.is_dir()
    assert list(root.glob("*.py")) == []


# --- the rooms ---------------------------------------------------------------------------------------------
# Read from the source (every import statement, at module level or inside a function), so that a rule holds
# whatever a package's __init__ happens to load.

SOURCE_ROOTS = {"ember": "sdk", "ember_platform": "platform", "ember_runtime": "runtime"}
FIRST_PARTY = tuple(SOURCE_ROOTS)


def _modules() -> dict[str, Path]:
    found = {}
    for package, root in SOURCE_ROOTS.items():
        for path in (REPO_ROOT / root / package).rglob("*.py"):
            parts = path.relative_to(REPO_ROOT / root).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()


def _imports(name: str, path: Path) -> list[tuple[str, bool]]:
    """``(module imported, at module level)`` for every first-party import of one module."""
    tree = ast.parse(path.read_text())
    top_level = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            assert not node.level, f"{name}: a relative import; Ember's modules import absolutely"
            base = node.module or ""
            # ``from pkg import mod`` imports the submodule when there is one
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found += [(t, id(node) in top_level) for t in targets if t.split(".")[0] in FIRST_PARTY]
    return found


@functools.cache
def _graph() -> dict[str, set[str]]:
    """Each first-party module's first-party imports: parsed when a test asks (not as every worker collects)."""
    return {name: {target for target, _ in _imports(name, path)} for name, path in MODULES.items()}


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


ROOM_RULES = [
    # room, the rooms it must not import
    ("ember.wire", ["ember._app", "ember._handles", "ember._client", "ember._function_call", "ember.cli", "ember.dev",
                    "ember.backends"]),
    ("ember.backends", ["ember.wire", "ember.cli", "ember.dev", "ember._client"]),
    ("ember_platform.scheduler", ["ember_platform.gateway", "ember_platform.calls", "ember_platform.control",
                                  "ember_platform.platform"]),
    ("ember_platform.calls", ["ember_platform.gateway", "ember_platform.control", "ember_platform.platform"]),
    ("ember_platform.control", ["ember_platform.gateway", "ember_platform.platform"]),
    ("ember_platform.natsauth", ["ember_platform.gateway", "ember_platform.calls", "ember_platform.control",
                                 "ember_platform.scheduler", "ember_platform.platform"]),
    # who may do what: below the gateway (which checks it) and beside the call path and the control loop
    ("ember_platform.auth", ["ember_platform.gateway", "ember_platform.calls", "ember_platform.control",
                             "ember_platform.scheduler", "ember_platform.platform"]),
    # quotas: below the gateway (which admits calls against them) and the control loop (which caps replicas)
    ("ember_platform.quotas", ["ember_platform.gateway", "ember_platform.calls", "ember_platform.control",
                               "ember_platform.scheduler", "ember_platform.natsauth", "ember_platform.platform"]),
    # secrets: below the gateway (its routes, the deploy check) and beside the auth callout
    ("ember_platform.secrets", ["ember_platform.gateway", "ember_platform.calls", "ember_platform.control",
                                "ember_platform.scheduler", "ember_platform.natsauth", "ember_platform.quotas",
                                "ember_platform.platform"]),
    ("ember_runtime.batching", ["ember_runtime.agent", "ember_runtime.replica", "ember_runtime.zygote"]),
    ("ember_runtime.agent", ["ember_runtime.replica", "ember_runtime.batching", "ember_runtime.zygote.process"]),
    ("ember_runtime.replica", ["ember_runtime.agent", "ember_runtime.zygote"]),
    ("ember_runtime.zygote", ["ember_runtime.agent"]),
]


def test_the_rooms_exist() -> None:
    rooms = {room for room, _ in ROOM_RULES} | {"ember.cli", "ember.dev", "ember_platform.gateway"}
    assert all(room in MODULES for room in rooms), rooms - set(MODULES)


@pytest.mark.parametrize(("room", "forbidden"), ROOM_RULES, ids=[room for room, _ in ROOM_RULES])
def test_a_room_imports_nothing_of_the_rooms_it_must_not(room: str, forbidden: list[str]) -> None:
    crossing = sorted(f"{module} -> {target}" for module, targets in _graph().items() if _in(module, room)
                      for target in targets if any(_in(target, other) for other in forbidden))
    assert crossing == []


def test_the_probe_sees_an_import_inside_a_function(tmp_path: Path) -> None:
    # The checks above would pass vacuously if the reader missed imports.
    source = tmp_path / "probe.py"
    source.write_text("import os\n\ndef f():\n    from ember_runtime.agent import node\n")
    assert _imports("ember_runtime.batching.probe", source) == [("ember_runtime.agent.node", False)]
    assert "ember_runtime.batching.policy" in _graph()["ember_runtime.batching.batcher"]
    assert "ember.wire.subjects" in _graph()["ember.wire.jetstream"]  # ``from ember.wire import subjects``


def test_first_party_imports_are_at_module_level() -> None:
    # A function-local import is how an import circle hides; there are none.
    local = sorted(f"{name} -> {target}" for name, path in MODULES.items() for target, top in _imports(name, path)
                   if not top)
    assert local == []


def test_there_is_no_import_circle() -> None:
    def cycle_from(start: str) -> list[str] | None:
        stack, seen = [(start, [start])], set()
        while stack:
            module, trail = stack.pop()
            for target in _graph().get(module, ()):
                if target == start:
                    return [*trail, start]
                if target not in seen and target in _graph():
                    seen.add(target)
                    stack.append((target, [*trail, target]))
        return None

    circles = [cycle for name in _graph() if (cycle := cycle_from(name)) is not None and len(cycle) > 2]
    assert circles == []


@pytest.mark.parametrize(("room", "library"), [
    ("ember_runtime.batching", "nats"),
    ("ember_platform.scheduler", "nats"),
    ("ember_platform.scheduler", "starlette"),
    ("ember.wire", "starlette"),
    ("ember_platform.auth", "starlette"),
    ("ember_platform.auth.scopes", "nats"),
    ("ember_platform.quotas", "starlette"),
    ("ember_platform.quotas.rules", "nats"),
    ("ember_platform.quotas.limiter", "nats"),
    ("ember_platform.quotas.caps", "nats"),
    ("ember_platform.secrets", "starlette"),
    ("ember_platform.secrets.checks", "nats"),
    ("ember.wire", "cryptography"),
    ("ember_runtime", "cryptography"),
])
def test_pure_rooms_stay_off_the_network(room: str, library: str) -> None:
    users = sorted(name for name, path in MODULES.items() if _in(name, room)
                   for node in ast.walk(ast.parse(path.read_text()))
                   if isinstance(node, ast.Import | ast.ImportFrom)
                   and any(n.split(".")[0] == library
                           for n in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                     else [node.module or ""])))
    assert users == []


def test_no_module_is_over_500_lines() -> None:
    long = sorted(f"{name}: {n}" for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 500)
    assert long == []
