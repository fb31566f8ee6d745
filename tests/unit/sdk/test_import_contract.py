"""The dependency direction is a contract: checked in fresh interpreters by looking at ``sys.modules``."""

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
