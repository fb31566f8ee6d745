"""``ember dev app.py`` keeps the platform up whatever its first push meets: an app whose import fails, or a newer
version pushed from another shell while the first one starts. It says what happened and keeps serving until Ctrl-C;
the other shell's ``ember push`` reaches it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from support.auth import bearer
from support.polling import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
EMBER = [sys.executable, "-m", "ember.cli"]

SLOW_START = '''import time

import ember

app = ember.App("{app}")
SETUP_S = {setup_s}


@app.model(min_replicas=1)
class Which:
    @ember.setup
    def load(self) -> None:
        time.sleep(SETUP_S)  # v1 is still starting when v2 is pushed

    @ember.method
    def which(self, x: int) -> float:
        return SETUP_S
'''
BROKEN = '''import ember

app = ember.App("{app}")
raise RuntimeError("the app's own import fails")
'''


@dataclass
class Dev:
    """An ``ember dev`` child and its output lines as they come."""

    proc: subprocess.Popen[str]
    state: Path
    out: list[str] = field(default_factory=list)

    def read(self) -> None:
        assert self.proc.stdout is not None
        for line in iter(self.proc.stdout.readline, ""):
            self.out.append(line.rstrip("\n"))

    def said(self, pattern: str) -> re.Match[str] | None:
        return next((m for line in list(self.out) if (m := re.search(pattern, line))), None)

    def env(self) -> dict[str, str]:
        """The environment of another shell that pushes to this Ember (its URL and admin token)."""
        url = wait_for(lambda: self.said(r"Ember is running at (\S+)"), timeout_s=120, what="the platform")
        return {**os.environ, "EMBER_URL": url.group(1), "EMBER_TOKEN": (self.state / "token").read_text().strip()}


@pytest.fixture
def dev(tmp_path: Path) -> Iterator[Callable[[Path], Dev]]:
    started: list[Dev] = []

    def start(app_file: Path) -> Dev:
        env = {k: v for k, v in os.environ.items() if k not in ("EMBER_URL", "EMBER_TOKEN")}
        state = tmp_path / "state"
        proc = subprocess.Popen([*EMBER, "dev", str(app_file), "--port", "0", "--state-dir", str(state)],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        child = Dev(proc, state)
        threading.Thread(target=child.read, daemon=True).start()
        started.append(child)
        return child

    yield start
    for child in started:
        if child.proc.poll() is None:
            child.proc.send_signal(signal.SIGINT)
            child.proc.wait(timeout=90)
        if child.proc.stdout is not None:
            child.proc.stdout.close()


def _stop(child: Dev) -> int:
    child.proc.send_signal(signal.SIGINT)
    return child.proc.wait(timeout=90)


def test_a_failed_import_is_shown_and_ember_keeps_serving(dev: Callable[[Path], Dev], tmp_path: Path) -> None:
    broken = tmp_path / "broken.py"
    broken.write_text(BROKEN.format(app="dev-broken"))
    child = dev(broken)
    env = child.env()
    wait_for(lambda: child.said("Ember keeps running"), timeout_s=120, what="the failed push shown")
    assert child.said(r"^push failed: InvalidSpecError: importing .*broken.py failed"), "\n".join(child.out)
    assert child.said(r"^RuntimeError: the app's own import fails$"), "\n".join(child.out)
    assert child.proc.poll() is None, "\n".join(child.out)

    fixed = tmp_path / "fixed.py"
    fixed.write_text(SLOW_START.format(app="dev-fixed", setup_s=0))
    pushed = subprocess.run([*EMBER, "push", str(fixed)], capture_output=True, text=True, env=env, timeout=240)
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    with httpx.Client(base_url=env["EMBER_URL"], headers=bearer(env["EMBER_TOKEN"]), timeout=30) as http:
        answer = http.post("/v1/dev-fixed/Which.which", json=1)
    assert answer.status_code == 200, answer.text
    assert _stop(child) == 0, "\n".join(child.out)


def test_a_newer_version_pushed_meanwhile_does_not_stop_ember(dev: Callable[[Path], Dev], tmp_path: Path) -> None:
    app_file = tmp_path / "racing.py"
    app_file.write_text(SLOW_START.format(app="dev-racing", setup_s=600))
    child = dev(app_file)
    env = child.env()
    with httpx.Client(base_url=env["EMBER_URL"], headers=bearer(env["EMBER_TOKEN"]), timeout=30) as http:
        def deployed_version() -> int | None:
            found = http.get("/v1/apps/dev-racing")
            return int(found.json()["version"]) if found.status_code == 200 else None

        wait_for(lambda: deployed_version() == 1, timeout_s=120, what="ember dev's own push of v1")
        app_file.write_text(SLOW_START.format(app="dev-racing", setup_s=0))  # another shell pushes a fix
        pushed = subprocess.run([*EMBER, "push", str(app_file)], capture_output=True, text=True, env=env,
                                timeout=240)
        assert pushed.returncode == 0, pushed.stdout + pushed.stderr
        wait_for(lambda: child.said("Ember keeps running"), timeout_s=60, what="the first push's end shown")
        assert child.said(r"dev-racing v2 was pushed meanwhile"), "\n".join(child.out)
        assert child.proc.poll() is None, "\n".join(child.out)
        answer = http.post("/v1/dev-racing/Which.which", json=1)
        assert answer.status_code == 200, answer.text
        assert answer.json() == 0  # v2 serves
    assert _stop(child) == 0, "\n".join(child.out)
