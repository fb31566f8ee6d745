"""A zygote acts only for the node agent: it checks each caller's credentials before it reads a request."""

from __future__ import annotations

import os
import socket

from ember_runtime.zygote.process import _from_agent


def test_a_caller_that_is_neither_the_zygotes_parent_nor_outside_its_pid_namespace_is_refused() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    with ours, theirs:  # the peer is this very process: inside our pid namespace, and not our parent
        assert not _from_agent(ours)


def test_the_zygotes_parent_is_the_agent_when_not_sandboxed() -> None:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:  # the child asks about its peer: its parent, which made the pair
        code = 0 if _from_agent(theirs) else 1
        os._exit(code)
    ours.close()
    _, status = os.waitpid(pid, 0)
    theirs.close()
    assert os.waitstatus_to_exitcode(status) == 0
