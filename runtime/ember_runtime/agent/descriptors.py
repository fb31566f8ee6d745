"""Descriptors the node agent holds for its replicas and zygotes: each has one owner, which closes it once.

A second close of a number is never harmless here: the agent's threads (the GPU memory watch reading /proc, a
bundle's digest, pasta's set-up) and its event loop open descriptors all the time, and the kernel gives each new one
the lowest free number; the second close then closes someone else's: a descriptor a zygote was to inherit (its start
fails with EBADF), or a pipe the loop watches, whose registration then stays and refuses every later pipe given the
same number (EEXIST). So:

- ``close`` says in the log when a descriptor was closed already (EBADF), naming what it was for: that is a double
  close, whose first may have closed another's descriptor.
- ``read_pipe`` reads the read end of a pipe or FIFO (a replica's output) on the running loop into an
  ``asyncio.StreamReader`` and closes it once at its end. It does not use ``loop.connect_read_pipe``: uvloop keeps
  that transport open after the end of file (a ``StreamReaderProtocol`` asks it to), so that it was closed only
  when the garbage collector freed it, at any moment, and then twice: by libuv, then by the file object it was
  handed (MagicStack/uvloop#763), with a ResourceWarning's Python code run between the two; a connection cancelled
  while it is made does the same.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os

log = logging.getLogger("ember.agent")
CHUNK = 64 * 1024


def close(fd: int, purpose: str) -> None:
    """Close ``fd`` (nothing where it is negative: none held); said in the log if it was closed already."""
    if fd < 0:
        return
    try:
        os.close(fd)
    except OSError as exc:
        if exc.errno != errno.EBADF:
            return  # EINTR, EIO: on Linux the descriptor is released all the same
        log.warning("%s (fd %d) was closed already: a double close, whose first may have closed another "
                    "descriptor of the agent", purpose, fd)


class _PipeReading:
    """The owner of one pipe's read end while the loop reads it: the transport a ``StreamReader`` pauses while its
    buffer is full, and resumes."""

    def __init__(self, fd: int, reader: asyncio.StreamReader, purpose: str) -> None:
        self._loop = asyncio.get_running_loop()
        self._fd = fd
        self._reader = reader
        self._purpose = purpose
        self._watched = False

    def pause_reading(self) -> None:
        if self._watched:
            self._loop.remove_reader(self._fd)
            self._watched = False

    def resume_reading(self) -> None:
        if not self._watched and self._fd >= 0:
            self._loop.add_reader(self._fd, self._readable)
            self._watched = True

    def _readable(self) -> None:
        try:
            data = os.read(self._fd, CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._end(exc)
            return
        if not data:
            self._end(None)
            return
        self._reader.feed_data(data)

    def _end(self, exc: OSError | None) -> None:
        self.pause_reading()  # out of the loop before its number is free for another
        close(self._fd, self._purpose)
        self._fd = -1
        if exc is None:
            self._reader.feed_eof()
        else:
            self._reader.set_exception(exc)


def read_pipe(fd: int, purpose: str) -> asyncio.StreamReader:
    """A reader of the pipe or FIFO read end ``fd``, which it owns from this call on: closed once its writers are
    gone (or at once, where the loop cannot watch it)."""
    reader = asyncio.StreamReader()
    reading = _PipeReading(fd, reader, purpose)
    try:
        os.set_blocking(fd, False)
        reader.set_transport(reading)  # type: ignore[arg-type]  # pause_reading and resume_reading are what it uses
        reading.resume_reading()
    except BaseException:
        close(fd, purpose)
        raise
    return reader


def read_pipes(*held: tuple[int, str]) -> list[asyncio.StreamReader]:
    """``read_pipe`` of each (descriptor, purpose); where one fails, those after it are closed too."""
    readers = []
    for i, (fd, purpose) in enumerate(held):
        try:
            readers.append(read_pipe(fd, purpose))
        except BaseException:
            for rest, what in held[i + 1:]:
                close(rest, what)
            raise
    return readers
