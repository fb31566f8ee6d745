"""What a zygote does with each message on its socket (``zygote.process._answer``), hostile ones included: a count
of spares is held within 1 and ``MAX_SPARES``, and a message it cannot read, or a request without the child's
stdout and stderr, is refused before anything is forked. Real sockets; the agent's side is the test."""

from __future__ import annotations

import socket

import msgspec
import pytest

from ember_runtime.zygote.process import _answer
from ember_runtime.zygote.protocol import MAX_SPARES, ForkReply, ForkRequest, Spares


def _never_fork():  # a refused message must not cost a fork
    raise AssertionError("forked for a message that was refused")


def _send(payload: bytes, target: int = 2) -> tuple[int, bytes]:
    """``payload`` from the agent's end; the count of spares wanted after it, and what the zygote answered."""
    agent, zygote = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with agent:
        agent.sendall(payload)
        kept = _answer(zygote, [], _never_fork, {}, target)
        agent.settimeout(5.0)
        return kept, agent.recv(1 << 16)


@pytest.mark.parametrize(("asked", "kept"), [(3, 3), (0, 1), (-5, 1), (10**9, MAX_SPARES)])
def test_a_count_of_spares_is_kept_within_its_bounds(asked, kept):
    got, answer = _send(msgspec.json.encode(Spares(count=asked)))
    assert got == kept and msgspec.json.decode(answer, type=Spares).count == kept


@pytest.mark.parametrize("payload", [
    b"\xff\x00not json",
    b'{"type": "spares", "count": "many"}',
    b'{"type": "launch", "argv": []}',
    b'{"argv": ["--app", "x"]}',  # a request that does not say what it is
    msgspec.json.encode(ForkRequest(argv=["--app", "x"])),  # no stdout and stderr passed with it
])
def test_a_message_it_cannot_take_is_refused_and_changes_nothing(payload):
    kept, answer = _send(payload, target=2)
    reply = msgspec.json.decode(answer, type=ForkReply)
    assert kept == 2 and reply.pid == 0 and reply.error
