"""deploy/docker/healthcheck.py, the image's HEALTHCHECK: it finds the Ember process in /proc, and a control
plane is healthy only while its /healthz answers 200 (asked over real HTTP here)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import ModuleType

import pytest
from support.paths import REPO


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("ember_healthcheck", REPO / "deploy" / "docker" / "healthcheck.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


hc = _load()


class _Server:
    def __init__(self) -> None:
        self.status = 200
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                code = outer.status if self.path == "/healthz" else 404
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *_: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    thread = threading.Thread(target=s.httpd.serve_forever, daemon=True)
    thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()
    thread.join(5)


def test_reads_the_command_lines_it_is_given() -> None:
    argv = ["/opt/ember/bin/python", "-m", "ember_platform", "--host", "0.0.0.0", "--port=9000"]
    assert hc.module_of(argv) == "ember_platform"
    assert hc.module_of(["python", "-m", "ember_platform.natsauth", "init", "x"]) == "ember_platform.natsauth"
    assert hc.module_of(["python", "/opt/ember/healthcheck.py"]) is None
    assert hc.health_url(argv) == "http://127.0.0.1:9000/healthz"
    assert hc.health_url(["python", "-m", "ember_platform"]) == "http://127.0.0.1:8700/healthz"
    assert hc.health_url(["python", "-m", "ember_platform", "--host", "::1"]) == "http://[::1]:8700/healthz"
    assert hc.health_url(["python", "-m", "ember_platform", "--port", "x"]) is None
    assert hc.health_url(["python", "-m", "ember_platform", "--port", "0"]) is None  # no URL file: unknown


def test_a_free_port_is_read_from_the_url_file(tmp_path: Path) -> None:
    (tmp_path / "url").write_text("http://127.0.0.1:41234\n")
    argv = ["python", "-m", "ember_platform", "--port", "0", "--url-file", str(tmp_path / "url")]
    assert hc.health_url(argv) == "http://127.0.0.1:41234/healthz"


def test_a_control_plane_is_healthy_while_healthz_answers_200(server: _Server) -> None:
    platform = ["python", "-m", "ember_platform", "--host", "0.0.0.0", "--port", str(server.port)]
    assert hc.healthy([platform]) == (True, "ok")
    server.status = 503
    ok, why = hc.healthy([platform])
    assert not ok and "does not answer 200" in why


def test_a_control_plane_that_does_not_listen_is_unhealthy(server: _Server) -> None:
    port = server.port
    server.httpd.server_close()  # nothing listens there any more
    ok, _ = hc.healthy([["python", "-m", "ember_platform", "--port", str(port)]])
    assert not ok


def test_a_node_agent_is_healthy_while_it_runs_and_nothing_is_not() -> None:
    assert hc.healthy([["python", "-m", "ember_runtime", "--state-dir", "/var/lib/ember"]])[0]
    ok, why = hc.healthy([])
    assert not ok and "no Ember process" in why


def test_finds_ember_processes_in_proc(tmp_path: Path) -> None:
    for pid, argv in ((1, [b"/usr/bin/tini", b"--", b"python", b"-m", b"ember_runtime"]),
                      (7, [b"python", b"-m", b"ember_runtime", b"--state-dir", b"/s"]),
                      (9, [b"python", b"-m", b"ember_runtime.replica"])):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cmdline").write_bytes(b"\0".join(argv) + b"\0")
    (tmp_path / "self").mkdir()
    (tmp_path / "12").mkdir()  # exited between the listing and the read: no cmdline
    found = list(hc.ember_processes(tmp_path))
    assert found == [["python", "-m", "ember_runtime", "--state-dir", "/s"]]


def test_main_exits_1_with_the_reason(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert hc.main(tmp_path) == 1  # an empty /proc: no Ember process
    assert "no Ember process" in capsys.readouterr().err
    (tmp_path / "3").mkdir()
    (tmp_path / "3" / "cmdline").write_bytes(b"python3.11\0-m\0ember_runtime\0")
    assert hc.main(tmp_path) == 0


def test_the_script_runs_on_the_standard_library_alone() -> None:
    done = subprocess.run([sys.executable, "-S", "-I", str(REPO / "deploy" / "docker" / "healthcheck.py")],
                          capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode in (0, 1) and "Traceback" not in done.stderr, done.stderr
