"""Pushing apps whose top level imports what most model code starts with (numpy, torch, scikit-learn, onnxruntime),
as a user does: `ember push` in its own process, or ``ember.deploy``, against the real platform.

From this machine, which has those packages: each app is imported as written, nothing is stood in for, and it
deploys and answers a call, with an image or without. From a machine that lacks a package (an honest one: a name
that is installed nowhere, which only the app's image provides from a local folder of wheels): the push stands in
for it when the app has an image, and says which package is missing when it has none.

The apps: tests/apps/imports.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import pytest
from support.paths import TEST_APPS
from support.platform import TestPlatform
from support.wheels import write_wheel

import ember
from ember._build import plan_images
from ember._client import Transport

pytestmark = pytest.mark.integration

IMPORTS = TEST_APPS / "imports"
ABSENT = "emberabsent"  # installed nowhere: only an image's local wheel has it

# app file, its app, a function, its input, its answer
INSTALLED = [
    ("with_numpy.py", "imports-numpy", "total", [1.5, 2.5], 4.0),
    ("with_torch.py", "imports-torch", "total", [1.5, 2.5], 4.0),
    ("with_sklearn.py", "imports-sklearn", "classify", 9.5, 1),
    ("with_onnxruntime.py", "imports-onnxruntime", "providers", {}, ["CPUExecutionProvider"]),
]


def _push(path: Path, url: str, token: str) -> subprocess.CompletedProcess[str]:
    """`ember push` in its own process, as a user runs it."""
    return subprocess.run([sys.executable, "-m", "ember.cli", "push", str(path)], capture_output=True, text=True,
                          timeout=300, check=False, env={**os.environ, "EMBER_URL": url, "EMBER_TOKEN": token})


@pytest.mark.timeout(360)  # a replica importing torch or scipy on a shared machine
@pytest.mark.parametrize(("file", "app", "fn", "data", "answer"), INSTALLED, ids=[row[0] for row in INSTALLED])
def test_an_app_importing_an_installed_package_at_the_top_is_pushed_and_answers(platform, http, file, app, fn, data,
                                                                               answer):
    pushed = _push(IMPORTS / file, platform.url, platform.token)
    assert pushed.returncode == 0, pushed.stderr
    assert f"{app} v" in pushed.stdout
    response = http.post(f"/v1/{app}/{fn}", json=data)
    assert response.status_code == 200, response.text
    got = response.json()
    assert (answer[0] in got) if isinstance(answer, list) else got == answer


def test_an_app_without_an_image_importing_a_package_this_machine_lacks_is_told_which(platform, tmp_path):
    assert importlib.util.find_spec(ABSENT) is None
    path = tmp_path / "lacking.py"
    path.write_text(f"import numpy\nimport ember\nimport {ABSENT}\n\napp = ember.App('imports-lacking')\n\n\n"
                    f"@app.function()\ndef f() -> str:\n    return {ABSENT}.hello()\n")
    pushed = _push(path, platform.url, platform.token)
    assert pushed.returncode != 0
    assert f"needs {ABSENT}, which this machine does not have and the app has no image" in pushed.stderr
    assert "numpy" not in pushed.stderr.replace(str(path), "")  # only the package that is really missing
    assert "Traceback" not in pushed.stderr


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_of_installed(name: str, folder: Path) -> str:
    """The installed distribution ``name`` as a wheel in ``folder`` (its files as this machine has them, its tags
    from its own WHEEL file): an image can then install it offline. Returns its version."""
    dist = metadata.distribution(name)
    info = f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}.dist-info"
    tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "").splitlines()
            if line.startswith("Tag:")]
    pythons, abis, plats = (".".join(sorted({t.split("-")[i] for t in tags})) for i in range(3))
    skip = {f"{info}/{n}" for n in ("RECORD", "INSTALLER", "REQUESTED", "direct_url.json")}
    record = []
    with zipfile.ZipFile(folder / f"{info.removesuffix('.dist-info')}-{pythons}-{abis}-{plats}.whl", "w") as wheel:
        for file in dist.files or []:
            arc = Path(str(file)).as_posix()
            if arc.startswith("..") or "__pycache__" in arc or arc in skip:
                continue
            data = Path(str(dist.locate_file(file))).read_bytes()
            wheel.writestr(arc, data)
            record.append(f"{arc},{_record_hash(data)},{len(data)}")
        wheel.writestr(f"{info}/RECORD", "\n".join([*record, f"{info}/RECORD,,"]) + "\n")
    return dist.version


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A local folder of wheels: numpy as this machine has it, and a package installed nowhere."""
    folder = tmp_path_factory.mktemp("import-wheels")
    write_wheel(folder, name=ABSENT, version="1.0")
    return folder, wheel_of_installed("numpy", folder)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory, wheels: tuple[Path, str]) -> Iterator[TestPlatform]:
    """A platform whose node may install images from the local folder of wheels."""
    state = tmp_path_factory.mktemp("ember-import-images")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EMBER_IMAGE_LOCAL_INDEXES", str(wheels[0]))
        with TestPlatform(state) as running:
            yield running


IMAGE_APP = '''
import numpy as np

import ember
{absent_import}

image = ember.Image(find_links=[{folder!r}], no_index=True).pip_install({packages})
app = ember.App({app!r}, image=image)


@app.function(min_replicas=1)
def report(xs: list[float]) -> dict:
    return {{"total": float(np.asarray(xs).sum()), "numpy": np.__version__, "absent": {absent_value}}}
'''


def _image_app(folder: Path, app: str, wheels: tuple[Path, str], absent: bool) -> Path:
    packages = [f"numpy=={wheels[1]}", *([f"{ABSENT}==1.0"] if absent else [])]
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "image_app.py"
    path.write_text(IMAGE_APP.format(absent_import=f"import {ABSENT}" if absent else "", folder=str(wheels[0]),
                                     packages=", ".join(map(repr, packages)), app=app,
                                     absent_value=f"{ABSENT}.hello()" if absent else "None"))
    return path


@pytest.mark.timeout(420)  # two image builds, each waited for, on a shared machine
def test_an_app_with_an_image_is_pushed_whether_this_machine_has_its_packages_or_not(tmp_path, node, wheels):
    client = Transport(node.url, token=node.token)
    try:
        # numpy is here: imported as written, nothing stood in for, the manifest read here too
        here = _image_app(tmp_path / "here", "imports-image-here", wheels, absent=False)
        found = plan_images(here)
        assert found.missing == [] and found.manifest is not None
        pushed = _push(here, node.url, node.token)
        assert pushed.returncode == 0, pushed.stderr
        answer = client.json("POST", "/v1/imports-image-here/report", json=[1.0, 2.0])
        assert answer == {"total": 3.0, "numpy": wheels[1], "absent": None}

        # the absent package is stood in for here (numpy is not), and the image provides it on the platform
        lacking = _image_app(tmp_path / "lacking", "imports-image-lacking", wheels, absent=True)
        assert plan_images(lacking).missing == [ABSENT]
        ember.deploy(lacking, transport=client, timeout_s=240)
        answer = client.json("POST", "/v1/imports-image-lacking/report", json=[1.0, 2.0])
        assert answer == {"total": 3.0, "numpy": wheels[1], "absent": f"{ABSENT} 1.0"}
    finally:
        client.close()
