"""What `ember push` stands in for when it imports an app (``python -m ember._inspect --images``, in a fresh
interpreter, as the push runs it): a top-level package this machine lacks that the app's own files import, and
nothing else: never an installed package's optional imports, never a submodule an installed package lacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from ember._plan import ImagePlan

ABSENT = "emberabsent"  # installed nowhere

INSTALLED = {"numpy": "import numpy as np", "torch": "import torch",
             "scikit-learn": "from sklearn.linear_model import LogisticRegression", "onnxruntime": "import onnxruntime"}


def _app(folder: Path, top: str, image: str = "'numpy'") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "app.py"
    path.write_text(f"{top}\nimport ember\n\napp = ember.App('stand-ins', image=ember.Image().pip_install({image}))"
                    "\n\n\n@app.function()\ndef f() -> int:\n    return 1\n")
    return path


def _inspect(path: Path, site: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    paths = [str(site)] if site else []  # a folder outside the app's: packages installed on this machine
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    return subprocess.run([sys.executable, "-m", "ember._inspect", "--images", str(path)], capture_output=True,
                          timeout=120, check=False, cwd=path.parent, env=env)


def _plan(path: Path, site: Path | None = None) -> ImagePlan:
    done = _inspect(path, site)
    assert done.returncode == 0, done.stderr.decode()
    return msgspec.json.decode(done.stdout, type=ImagePlan)


@pytest.mark.parametrize("dist", sorted(INSTALLED))
def test_an_installed_package_imported_at_the_top_is_imported_as_it_is(tmp_path, dist):
    found = _plan(_app(tmp_path, INSTALLED[dist], image=repr(dist)))
    assert found.missing == [] and found.manifest is not None  # nothing stood in: the manifest is read here


def test_a_helper_beside_the_app_may_import_what_only_the_image_has(tmp_path):
    (tmp_path / "helper.py").write_text(f"from {ABSENT}.models import Net\n\nNET = Net\n")
    found = _plan(_app(tmp_path, f"import helper\nimport numpy\nimport {ABSENT}", image=repr(ABSENT)))
    assert found.missing == [ABSENT] and found.manifest is None


def test_an_installed_packages_optional_import_is_never_stood_in_for(tmp_path):
    site = tmp_path / "site"
    (site / "optional").mkdir(parents=True)
    (site / "optional" / "__init__.py").write_text(
        "try:\n    import emberoptional\nexcept ImportError:\n    emberoptional = None\n"
        "HAS = emberoptional is not None\n")
    app = _app(tmp_path / "app", f"import {ABSENT}\nimport optional\nassert not optional.HAS, 'stood in'",
               image=repr(ABSENT))
    assert _plan(app, site).missing == [ABSENT]


def test_an_installed_package_imported_after_the_app_stood_in_for_a_package_does_not_see_the_stand_in(tmp_path):
    site = tmp_path / "site"
    (site / "optional").mkdir(parents=True)
    (site / "optional" / "__init__.py").write_text(
        f"try:\n    import {ABSENT}\nexcept ImportError:\n    {ABSENT} = None\nHAS = {ABSENT} is not None\n")
    app = _app(tmp_path / "app", f"import {ABSENT}\nimport optional\nassert not optional.HAS, 'saw the stand-in'",
               image=repr(ABSENT))
    assert _plan(app, site).missing == [ABSENT]


def test_an_installed_package_that_needs_a_missing_one_is_an_error_naming_both(tmp_path):
    site = tmp_path / "site"
    (site / "needy").mkdir(parents=True)
    (site / "needy" / "__init__.py").write_text("import embermissingdep\n")
    done = _inspect(_app(tmp_path / "app", "import needy", image="'needy'"), site)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err
    assert f"{site / 'needy' / '__init__.py'} imports embermissingdep, which this machine does not have" in err


def test_a_submodule_an_installed_package_lacks_is_an_error_naming_it(tmp_path):
    done = _inspect(_app(tmp_path, "import numpy.nothing_here"))
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err
    assert "app.py imports numpy.nothing_here, which the installed numpy does not have" in err


def test_without_an_image_the_error_names_only_the_package_really_missing(tmp_path):
    path = tmp_path / "app.py"
    path.write_text(f"import numpy\nimport torch\nimport {ABSENT}\nimport ember\napp = ember.App('bare')\n\n\n"
                    "@app.function()\ndef f() -> int:\n    return 1\n")
    done = _inspect(path)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err
    assert f"importing app.py needs {ABSENT}, which this machine does not have and the app has no image" in err
