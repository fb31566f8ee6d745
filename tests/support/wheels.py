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


def write_wheel(folder: Path, name: str = PACKAGE, version: str = "1.0", requires: tuple[str, ...] = ()) -> Path:
    """A pure-Python wheel of ``name`` at ``version`` whose module says its version (``name.__version__``)."""
    dist = f"{name.replace('-', '_')}-{version}"
    files = {
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
