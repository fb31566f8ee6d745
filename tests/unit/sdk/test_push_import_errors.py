"""An app whose import fails: `ember push` shows the app's own error, from the app's first frame on, and none of
the frames that carried its import (Ember's inspection, importlib, runpy). The push fails before it reaches any
platform, so none is started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CARRIERS = ("_inspect.py", "_loader.py", "_lenient.py", "_plan.py", "importlib", "runpy", "<frozen")


def _push(path: Path) -> subprocess.CompletedProcess[str]:
    """`ember push` in its own process, as a user runs it (the URL is never reached: the import fails first)."""
    return subprocess.run([sys.executable, "-m", "ember.cli", "push", str(path)], capture_output=True, text=True,
                          timeout=120, check=False, cwd=path.parent,
                          env={**os.environ, "EMBER_URL": "http://127.0.0.1:9", "EMBER_TOKEN": "unused"})


def test_a_syntax_error_is_shown_as_its_file_line_and_message_alone(tmp_path):
    path = tmp_path / "app.py"
    path.write_text("import ember\n\napp = ember.App('broken')\n\n\n@app.function()\ndef f(x: int) -> int:\n"
                    "    return x +\n")
    pushed = _push(path)
    assert pushed.returncode != 0
    assert f'File "{path}", line 8' in pushed.stderr and "SyntaxError: invalid syntax" in pushed.stderr
    assert "Traceback" not in pushed.stderr
    assert not [c for c in CARRIERS if c in pushed.stderr], pushed.stderr


def test_an_error_raised_by_the_apps_code_keeps_its_frames_and_those_below_them(tmp_path):
    (tmp_path / "settings.py").write_text("import json\n\n\ndef load() -> dict:\n    return json.loads('{bad')\n")
    path = tmp_path / "app.py"
    path.write_text("import ember\nimport settings\n\napp = ember.App('broken')\nCONFIG = settings.load()\n")
    pushed = _push(path)
    assert pushed.returncode != 0
    lines = pushed.stderr.splitlines()
    start = lines.index("Traceback (most recent call last):")
    assert lines[start + 1] == f'  File "{path}", line 5, in <module>'  # the app's frame is the first one
    assert f'File "{tmp_path / "settings.py"}", line 5, in load' in pushed.stderr
    assert 'json/__init__.py", line' in pushed.stderr  # what the app called is kept
    assert lines[-1].startswith("json.decoder.JSONDecodeError: Expecting property name")
    assert not [c for c in CARRIERS if c in pushed.stderr], pushed.stderr
