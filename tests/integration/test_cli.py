"""The `ember` CLI, end to end: `ember dev` with an app, push/ls/call/logs/delete, and a clean stop."""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.paths import REPO
from support.streams import read_lines

pytestmark = pytest.mark.integration
EMBER = [sys.executable, "-m", "ember.cli"]


def processes_mentioning(needle: str) -> list[str]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if needle in cmdline or needle in cwd:
            found.append(f"{entry.name}: {cmdline}")
    return found


def test_push_ls_call_logs_delete(platform, tmp_path, ember_cli):
    app = tmp_path / "clitest.py"
    app.write_text('import ember\napp = ember.App("clitest")\n'
                   "@app.function()\ndef shout(text: str) -> str:\n    print('shouting', text)\n"
                   "    return text.upper()\n")
    pushed = ember_cli("push", str(app), url=platform.url)
    assert f"POST {platform.url}/v1/clitest/shout" in pushed.stdout
    assert "ready" in pushed.stderr  # the progress display
    assert "clitest.shout" in ember_cli("ls", url=platform.url).stdout
    assert ember_cli("call", "clitest.shout", "--data", '"hey"', url=platform.url).stdout.strip() == '"HEY"'
    deadline = time.monotonic() + 20
    while "shouting hey" not in ember_cli("logs", "clitest.shout", url=platform.url).stdout:
        assert time.monotonic() < deadline, "the replica's output never reached `ember logs`"
        time.sleep(0.2)
    bad = ember_cli("call", "clitest.shout", "--data", "5", url=platform.url, check=False)
    assert bad.returncode == 1 and "InvalidInputError" in bad.stderr
    ember_cli("delete", "clitest", url=platform.url)
    assert "clitest" not in ember_cli("ls", url=platform.url).stdout


def test_a_push_waiting_for_a_replica_no_node_can_take_says_why(platform, tmp_path, ember_cli):
    app = tmp_path / "nogpu.py"
    app.write_text('import ember\napp = ember.App("cli-no-gpu")\n'
                   '@app.function(gpu="B300")\ndef f(x: int) -> int:\n    return x\n')
    pushed = ember_cli("push", "--timeout", "6", str(app), url=platform.url, check=False)
    try:
        assert pushed.returncode == 1
        why = "f 0/1 ready (unschedulable: no node has a GPU of type B300"
        *_, shown, error = pushed.stderr.splitlines()
        assert why in shown, pushed.stderr  # the progress shows it while it waits, the error at the end
        assert error.startswith(f"ember: UnavailableError: cli-no-gpu v1 not ready after 6s: {why}"), error
    finally:
        ember_cli("delete", "cli-no-gpu", url=platform.url)


def test_cli_reports_an_unreachable_platform_clearly(ember_cli):
    proc = ember_cli("ls", url="http://127.0.0.1:9", check=False)
    assert proc.returncode == 1
    assert "cannot reach the Ember platform" in proc.stderr and "Traceback" not in proc.stderr


def test_ember_dev_serves_an_app_and_stops_leaving_no_process(tmp_path, ember_cli):
    state = tmp_path / "dev-state"
    cmd = [*EMBER, "dev", str(REPO / "examples" / "hello" / "hello.py"), "--port", "0", "--state-dir", str(state)]
    # started with SIGINT ignored, as a shell's background job is: Ctrl-C (SIGINT) stops it all the same
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN)) as dev:
        lines: queue.Queue[str] = queue.Queue()
        reader = read_lines(dev.stdout, lines.put)
        try:
            url = token = ""
            deadline = time.monotonic() + 120
            while not (url and token):
                line = lines.get(timeout=max(0.1, deadline - time.monotonic()))
                if line.startswith("export EMBER_URL="):
                    url = line.split("=", 1)[1].split()[0]
                if line.startswith("export EMBER_TOKEN="):
                    token = line.split("=", 1)[1].split()[0]
            assert (state / "token").read_text().strip() == token  # the dev token, saved in the state folder
            assert (state / "token").stat().st_mode & 0o777 == 0o600
            called = ember_cli("call", "hello.greet", "--data", '"dev"', url=url, token=token)
            assert called.stdout.strip() == '"Hello, dev!"'
            assert processes_mentioning(str(state)), "expected nats-server, platform, agent and replicas running"
        finally:
            dev.send_signal(signal.SIGINT)
            code = dev.wait(timeout=90)
            reader.join(timeout=10)
    assert code == 0
    deadline = time.monotonic() + 10
    while (left := processes_mentioning(str(state))) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left, f"processes left behind: {left}"
