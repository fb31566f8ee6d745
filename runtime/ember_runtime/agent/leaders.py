"""Signalling a process, and the process group it leads, through a pidfd: never by a number that may be another's.

A pid number is free again once its process is reaped and no process is left in the group or session it led; the
next process given that number may lead a group of its own (bwrap's init in another tenant's sandbox, a replica, a
node agent started in a session of its own). A signal sent by number (``os.killpg(pid)``) after the exit reaches
that group (issue 27). A pidfd opened while the number was the process's names that process for good:
``pidfd_send_signal`` reaches it or nothing, and with ``PIDFD_SIGNAL_PROCESS_GROUP`` (Linux 6.9) the processes
still in its group, even after it was reaped, and never a group that took its number.

Open a ``Leader`` while the number is known to be the process's: at its start (a number the kernel just gave out
comes around again only after a full turn of the pid space), or checked after the pidfd was opened (adoption).
"""

from __future__ import annotations

import contextlib
import errno
import os
import select
import signal

PIDFD_SIGNAL_PROCESS_GROUP = 1 << 2  # <linux/pidfd.h>: the group of the pidfd's process (Linux 6.9)


def signal_group(pidfd: int, pid: int, sig: int) -> None:
    """Send ``sig`` to the process group led by ``pidfd``'s process (number ``pid``); nothing where none is left."""
    try:
        signal.pidfd_send_signal(pidfd, sig, None, PIDFD_SIGNAL_PROCESS_GROUP)
    except (ProcessLookupError, PermissionError):
        pass
    except OSError as exc:
        if exc.errno != errno.EINVAL:  # before Linux 6.9: no group through a pidfd
            raise
        signal_group_by_number(pidfd, pid, sig)


def signal_group_by_number(pidfd: int, pid: int, sig: int) -> None:
    """Before Linux 6.9: ``os.killpg(pid)``, only while ``pidfd``'s process has not exited (its number is its own
    then); what it left in its group after its exit is not reached (a sandbox's die with its init)."""
    if not exited(pidfd):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)


def exited(pidfd: int) -> bool:
    """Whether ``pidfd``'s process has exited (a pidfd is readable from then on)."""
    poll = select.poll()  # not select(): the agent's descriptors go past FD_SETSIZE
    poll.register(pidfd, select.POLLIN)
    return bool(poll.poll(0))


class Leader:
    """A process held by a pidfd (``pid``: its number, for the log and the reports), and the group it leads. Once it
    is closed, or where it could not be opened (the process was gone), signals go nowhere."""

    def __init__(self, pid: int, pidfd: int) -> None:
        self.pid = pid
        self._pidfd = pidfd

    @classmethod
    def open(cls, pid: int) -> Leader:
        """The process ``pid``, whose number must be its own now (see the module's docstring)."""
        try:
            return cls(pid, os.pidfd_open(pid))
        except OSError:
            return cls(pid, -1)

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the process alone."""
        if self._pidfd >= 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self._pidfd, sig)

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the process group it leads: those of its processes still in it, even after it exited."""
        if self._pidfd >= 0:
            signal_group(self._pidfd, self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the group it leads, and the process itself (where it did not lead one yet)."""
        self.signal_group(signal.SIGKILL)
        self.signal(signal.SIGKILL)

    def close(self) -> None:
        if self._pidfd >= 0:
            os.close(self._pidfd)
            self._pidfd = -1

    def __del__(self) -> None:
        self.close()  # the pidfd is this object's alone: no other owner can have closed or reused it meanwhile
