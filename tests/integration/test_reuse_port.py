"""Several control planes on one host serve one port with ``--reuse-port`` (SO_REUSEPORT): the kernel spreads the
connections among them, each routes calls on its own, and one that stops leaves the port to the others. Without
the flag a second one cannot bind the port."""

from __future__ import annotations

import math
import socket

import httpx
import pytest
from support.auth import bearer

from ember._errors import UnavailableError

pytestmark = pytest.mark.integration


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _calls(url: str, token: str, n: int) -> list[int]:
    """``n`` calls of hello.add, each on a connection of its own (so that the kernel chooses a process for each)."""
    results = []
    for i in range(n):
        with httpx.Client(timeout=30, headers=bearer(token)) as http:
            answer = http.post(f"{url}/v1/hello/add", json={"a": i, "b": 1})
            assert answer.status_code == 200, answer.text
            results.append(answer.json())
    return results


def test_control_planes_share_a_port_with_reuse_port(platform, hello):
    port = _free_port()
    first = platform.add_control_plane("shared-a", port=port, flags=("--reuse-port",))
    second = platform.add_control_plane("shared-b", port=port, flags=("--reuse-port",))
    assert first == second == f"http://{platform.host}:{port}"
    try:
        assert _calls(first, platform.token, 20) == [i + 1 for i in range(20)]
        platform.kill("shared-a")
        assert _calls(first, platform.token, 10) == [i + 1 for i in range(10)]  # the other one serves the port
    finally:
        for name in ("shared-a", "shared-b"):
            if name in platform._procs:
                platform.kill(name)


def test_without_reuse_port_a_second_control_plane_cannot_take_the_port(platform):
    port = _free_port()
    platform.add_control_plane("alone-a", port=port, flags=("--reuse-port",))
    try:
        with pytest.raises(UnavailableError, match="exited"):  # no deadline: it starts (a failure) or it exits,
            platform.add_control_plane("alone-b", port=port, timeout_s=math.inf)  # however long a loaded host takes
    finally:
        for name in ("alone-a", "alone-b"):
            if name in platform._procs:
                platform.kill(name)
