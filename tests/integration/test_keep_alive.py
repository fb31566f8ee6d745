"""The control plane keeps an idle connection open longer than its clients do (httpx, like most, lets one go after
5 s idle; load balancers after 60 s): the client always closes first. Before, both waited 5 s, and a request sent
on a connection as the server closed it met "Server disconnected without sending a response", which httpx does
not retry for a POST."""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.integration

CLIENT_IDLE_S = 5.0  # httpx's keepalive_expiry, and uvicorn's default keep-alive
REQUEST = b"GET /healthz HTTP/1.1\r\nHost: ember\r\n\r\n"


def _answer(sock: socket.socket) -> bytes:
    """One whole response to ``REQUEST`` (head, then as much body as its content-length says); what came before
    the server closed, where it did."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


def test_an_idle_connection_outlives_a_clients_own_idle_limit(platform) -> None:
    address = urlsplit(platform.url)
    with socket.create_connection((address.hostname, address.port), timeout=30) as sock:
        sock.sendall(REQUEST)
        assert _answer(sock).startswith(b"HTTP/1.1 200")  # the body read too: nothing left to read
        time.sleep(CLIENT_IDLE_S + 1.5)  # idle past the client's limit: a client that kept it still may use it
        sock.sendall(REQUEST)
        assert _answer(sock).startswith(b"HTTP/1.1 200")
