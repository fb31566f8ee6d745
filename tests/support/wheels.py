"""Small wheels of a throwaway package, written by hand (a wheel is a zip with its metadata), for offline image
tests: no build backend, no index."""

from __future__ import annotations

import base64
import hashlib
import zipfile
from pathlib import Path

PACKAGE = "emberprobe"  # not on PyPI's list of Ember's dependencies; the tests install it from a local folder


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_wheel(folder: Path, name: str = PACKAGE, version: str = "1.0", requires: tuple[str, ...] = (),
                extra: dict[str, str] | None = None) -> Path:
    """A pure-Python wheel of ``name`` at ``version`` whose module says its version (``name.__version__``), with
    ``extra`` files (archive path -> text) beside."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {**(extra or {}),
        f"{name}/__init__.py": f'__version__ = "{version}"\n\ndef hello():\n    return "{name} {version}"\n',
        f"{dist}.dist-info/METADATA": "Metadata-Version: 2.1\n"
                                      f"Name: {name}\nVersion: {version}\n"
                                      + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: ember-tests\nRoot-Is-Purelib: true\n"
                                   "Tag: py3-none-any\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{dist}-py3-none-any.whl"
    record = []
    with zipfile.ZipFile(path, "w") as wheel:
        for arc, text in files.items():
            data = text.encode()
            wheel.writestr(arc, data)
            record.append(f"{arc},{_record_hash(data)},{len(data)}")
        record.append(f"{dist}.dist-info/RECORD,,")
        wheel.writestr(f"{dist}.dist-info/RECORD", "\n".join(record) + "\n")
    return path


def write_sdist(folder: Path, name: str, version: str, marker: Path) -> Path:
    """A source distribution whose build writes ``marker``: installing it would run its code."""
    import io
    import tarfile

    base = f"{name}-{version}"
    files = {
        f"{base}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{base}/pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        # an in-tree build backend: importing it (what building does first) writes the marker
        f"{base}/backend.py": f"open({str(marker)!r}, 'w').write('built')\n"
                              "def get_requires_for_build_wheel(config_settings=None):\n    return []\n",
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{base}.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for arc, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(arc)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
