"""The replica's model thread: one long-lived thread that runs the setup and every batch of sync code.

It is an ``Executor`` (``run_in_executor`` and ``submit`` work as with a pool of one), and it has a shorter way
for the batcher: :meth:`ModelThread.call` hands a job over on a ``SimpleQueue`` and answers on the caller's event
loop through one ``call_soon_threadsafe``, without the ``concurrent.futures.Future`` (its lock and condition) and
the chaining of two futures that ``run_in_executor`` pays on every batch. The model keeps its own thread (sync
code may block, and a call it makes to another function waits on the event loop), so the loop goes on receiving
while a batch runs.

What a job raises comes back as it was, but for a ``BaseException`` that is no ``Exception`` (``SystemExit`` from
code that calls ``sys.exit``, say): that would end the event loop that awaits it, so it comes as a ``RuntimeError``
raised from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

_STOP = object()


class ModelThread(Executor):
    def __init__(self, name: str = "ember-model") -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name=name)  # not a daemon: a stuck batch is seen
        self._thread.start()
        # Told to stop when the interpreter exits, as concurrent.futures' workers are (before it joins the threads
        # that are not daemons): a replica that ended before its run's clean-up (its NATS connection refused, say)
        # waited for this idle thread for good.
        threading._register_atexit(self.shutdown, False)  # type: ignore[attr-defined]

    @property
    def native_id(self) -> int:
        """The thread's id in the kernel (``sched_setaffinity`` takes it)."""
        return self._thread.native_id or 0

    def call(self, loop: asyncio.AbstractEventLoop, fn: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
        """Run ``fn(*args)`` on the model thread; its result (or exception) on ``loop``'s future."""
        waiter = loop.create_future()
        if self._closed:
            raise RuntimeError("the model thread is shut down")
        self._jobs.put((fn, args, loop, waiter))
        return waiter

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if self._closed:
            raise RuntimeError("the model thread is shut down")
        future: Future[Any] = Future()
        self._jobs.put((lambda: fn(*args, **kwargs), (), None, future))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop taking jobs; the thread leaves once the job it runs is done (``cancel_futures``: the jobs still
        queued are cancelled, else run first)."""
        if not self._closed:
            self._closed = True
            if cancel_futures:
                self._cancel_queued()
            self._jobs.put(_STOP)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    def _cancel_queued(self) -> None:
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                return
            if job is _STOP:
                continue
            _, _, loop, waiter = job
            if loop is None:
                waiter.cancel()
            else:
                _settle_soon(loop, waiter.cancel)

    def _work(self) -> None:
        while (job := self._jobs.get()) is not _STOP:
            self._run(*job)
            del job  # nothing of a batch outlives it on this thread while it waits for the next

    @staticmethod
    def _run(fn: Callable[..., Any], args: tuple[Any, ...], loop: asyncio.AbstractEventLoop | None,
             waiter: Any) -> None:
        if loop is None:  # from submit(): a concurrent Future
            if waiter.set_running_or_notify_cancel():
                try:
                    waiter.set_result(fn())
                except BaseException as exc:
                    waiter.set_exception(_for_loop(exc))
            return
        try:
            result = fn(*args)
        except BaseException as exc:
            _settle_soon(loop, _fail, waiter, _for_loop(exc))
        else:
            _settle_soon(loop, _succeed, waiter, result)


def _settle_soon(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
    with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits any more
        loop.call_soon_threadsafe(fn, *args)


def _succeed(waiter: asyncio.Future[Any], result: Any) -> None:
    if not waiter.done():
        waiter.set_result(result)


def _fail(waiter: asyncio.Future[Any], exc: BaseException) -> None:
    if not waiter.done():
        waiter.set_exception(exc)


def _for_loop(exc: BaseException) -> BaseException:
    """``exc`` as an event loop may be given it (see the module's docstring)."""
    if isinstance(exc, Exception):
        return exc
    error = RuntimeError(f"the model thread's job raised {type(exc).__name__}: {exc}")
    error.__cause__ = exc
    return error
