"""``ember dev app.py --watch`` as a user runs it: editing the app file pushes a new version that serves within
seconds, while the version before keeps serving; a save with a syntax error is shown and changes nothing."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from support.auth import bearer
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

SOURCE = '''import ember

app = ember.App("watched")
VERSION = "{version}"


@app.function(min_replicas=1)
def which(x: int) -> str:
    return VERSION
'''


class Lines:
    """A child's output lines as they come, each with when it arrived."""

    def __init__(self, stream) -> None:  # type: ignore[no-untyped-def]
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:  # type: ignore[no-untyped-def]
        for line in iter(stream.readline, ""):
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def first(self, pattern: str, after: float = 0.0) -> tuple[float, re.Match[str]] | None:
        for at, line in list(self.lines):
            if at >= after and (m := re.search(pattern, line)):
                return at, m
        return None

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)


def test_editing_the_app_pushes_a_rollout_and_a_broken_save_keeps_the_old_version(tmp_path: Path) -> None:
    app_file = tmp_path / "app" / "watched.py"
    app_file.parent.mkdir()
    app_file.write_text(SOURCE.format(version="one"))
    env = {k: v for k, v in os.environ.items() if k not in ("EMBER_URL", "EMBER_TOKEN")}
    proc = subprocess.Popen([sys.executable, "-m", "ember.cli", "dev", str(app_file), "--watch", "--port", "0",
                             "--state-dir", str(tmp_path / "state")], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    out, err = Lines(proc.stdout), Lines(proc.stderr)
    try:
        _, url = wait_for(lambda: out.first(r"Ember is running at (\S+)"), timeout_s=120, what="the platform")
        _, token = wait_for(lambda: out.first(r"export EMBER_TOKEN=(\S+)"), timeout_s=120, what="the first push")
        wait_for(lambda: out.first("watching"), timeout_s=30, what="the watcher")
        with httpx.Client(base_url=url.group(1), headers=bearer(token.group(1)), timeout=30) as http:
            def answer() -> str:
                response = http.post("/v1/watched/which", json=1)
                assert response.status_code == 200, response.text
                return str(response.json())

            assert answer() == "one"

            saved = time.monotonic()
            app_file.write_text(SOURCE.format(version="two"))
            wait_for(lambda: err.first(r"deployed watched version 2", after=saved), timeout_s=30,
                     what="the push of v2\n" + out.text() + err.text())
            seen = set()
            deadline = time.monotonic() + 60
            while "two" not in seen and time.monotonic() < deadline:  # every call answers while v2 rolls out
                seen.add(answer())
            assert seen <= {"one", "two"} and "two" in seen
            assert answer() == "two"
            wait_for(lambda: out.first(r"watched v2 serves .*v2 100%", after=saved), timeout_s=30,
                     what="the watcher to say v2 serves")

            broken = time.monotonic()
            app_file.write_text(SOURCE.format(version="three").replace("def which", "def which(("))
            wait_for(lambda: err.first("push failed", after=broken), timeout_s=30, what="the failed push")
            wait_for(lambda: "SyntaxError" in err.text(), timeout_s=30,  # the message's last line: read a little later
                     what="the failed push's SyntaxError")
            assert answer() == "two"

            (app_file.parent / "helper.txt").write_text("another file of the folder counts too")
            app_file.write_text(SOURCE.format(version="four"))
            wait_for(lambda: answer() == "four", timeout_s=60, what="v3 to serve")
            assert http.get("/v1/apps/watched").json()["version"] == 3  # the broken save made no version
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        out.thread.join(10)
        err.thread.join(10)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
