"""A replica process: ``python -m ember_runtime.replica ...``, started by the node agent.

It imports the app from its unpacked bundle, runs setup once, reports ready, and serves each of its
functions' invoke subjects through a micro-batcher until SIGTERM, when it drains.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

import msgspec
from nats.aio.msg import Msg

from ember import _gc
from ember import _inner as inner
from ember import _loop as ember_loop
from ember import _tracing as tracing
from ember._errors import EmberError, NotFoundError, UnavailableError
from ember._loader import find_app, import_app_module
from ember._loop import cancel_and_wait
from ember.wire import (
    Invocation,
    LoadReport,
    ReplicaStatus,
    StartPhases,
    encoder,
    is_json_frame,
    natsflush,
    subjects,
)
from ember.wire.headers import TERMINATE_HEADER
from ember.wire.jetstream import call_buckets, connect_until
from ember.wire.natscreds import NatsCredentials, take_from_env
from ember.wire.streams import credit_decoder
from ember_runtime import hostpid, lifeline, natsdoor, warm
from ember_runtime.batching import spans
from ember_runtime.batching.batcher import Batcher, Call
from ember_runtime.batching.modelthread import ModelThread
from ember_runtime.exit_codes import EXIT_ABANDONED_SETUP, EXIT_SETUP_FAILED, EXIT_SETUP_TIMED_OUT, EXIT_TERMINATED
from ember_runtime.replica import arguments, health, reports
from ember_runtime.replica.answers import Answers, answer_of, declared_output
from ember_runtime.replica.calling import NatsRelay, serving
from ember_runtime.replica.callreads import RelayedCallStore
from ember_runtime.replica.endpoint import Endpoint, Preloaded, Streamed, batcher_for, build_endpoints, tear_down
from ember_runtime.replica.queue_worker import QueueWorker
from ember_runtime.replica.renewal import renew_until
from ember_runtime.replica.reports import HEARTBEAT_S, IDLE_REPORT_S, LOAD_REPORT_S, heartbeat_due, report_due
from ember_runtime.replica.salvage import decode_frame
from ember_runtime.replica.standby import Standby
from ember_runtime.replica.status import StatusRelay
from ember_runtime.replica.streams import Streams

log = logging.getLogger("ember.replica")
CONNECT_WAIT_S = 30.0  # a control plane that has just assigned the replica may take a moment to admit it
DRAIN_GRACE_S = 20.0
STUCK_GRACE_S = 2.0  # a batch still running this long after its calls' timeout_s makes the replica stuck
STUCK_CHECK_S = 1.0


class Replica:
    def __init__(self, args: argparse.Namespace, preloaded: Preloaded | None = None,
                 executor: ModelThread | None = None) -> None:
        self.args = args
        self.preloaded = preloaded  # forked from a zygote: the app is imported and its snap setup has run
        self.status = ReplicaStatus(replica_id=args.replica_id, node_id=args.node_id, app=args.app,
                                    service=args.service, version=args.version, state="starting", pid=hostpid.current(),
                                    started_at=time.time(), updated_at=time.time(), restarts=args.restarts,
                                    restart_reason=args.restart_reason)
        self.executor = executor or ModelThread()  # the setup and every batch of sync code (see ``modelthread``)
        self.batchers: list[Batcher] = []
        self.workers: list[QueueWorker] = []
        self.standby = Standby()  # a warm replica's: no queued calls while its version is out of the traffic
        self.pullers: list[asyncio.Task[None]] = []
        self.stop = asyncio.Event()
        self.activity = asyncio.Event()  # a call was queued (wakes the load reports of an idle replica)
        self.stuck = False
        self._intake: tuple[list[Any], list[Any]] = [], []  # all subscriptions, those that take calls
        self.endpoints: list[Endpoint] = []
        self.instance: Any = None  # a class model's, once set up: its teardown runs when the replica stops
        self._repeats = 0  # heartbeats in a row that wrote the status unchanged
        self.renewal: asyncio.Task[None] | None = None
        self._connecting: asyncio.Task[Any] | None = None

    def connect(self, creds: NatsCredentials | None) -> asyncio.Task[Any]:
        """Begin connecting to NATS as ``creds`` (this replica's own): first, as it takes longest (door, server, auth
        callout). In a network of its own, NATS is reached through the sandbox's door."""
        if self._connecting is None:
            natsdoor.install()
            self._connecting = asyncio.create_task(connect_until(
                self.stop, self.args.nats, f"ember-replica-{self.args.replica_id}", creds, wait_s=CONNECT_WAIT_S))
        return self._connecting

    async def run(self, creds: NatsCredentials | None = None) -> int:
        """Set up, serve until stopped, drain; connected to NATS as ``creds`` (by ``connect``)."""
        connecting = self.connect(creds)
        load = asyncio.create_task(self._load(), name="setup")  # on the model thread, while NATS connects
        nc = await connecting
        if nc is None:  # stopped before NATS admitted it: nothing to drain (the process leaves at once, main())
            return EXIT_ABANDONED_SETUP
        self.kv = StatusRelay(nc, self.args.replica_id)
        relay = NatsRelay(nc, self.args.replica_id)
        inner.install(relay)  # the app's calls of functions go over this connection
        self.calls = RelayedCallStore(nc.jetstream(), *call_buckets(nc.jetstream()), relay)  # its agent saw them
        heartbeat = asyncio.create_task(self._heartbeat(), name="heartbeat")
        if creds is not None and creds.ttl_s:  # its credentials expire: reconnect before (``renewal``)
            self.renewal = asyncio.create_task(renew_until(nc, creds.ttl_s, self.stop), name="renew-credentials")
        try:
            stopped = asyncio.create_task(self.stop.wait())
            limit = self.args.startup_timeout_s - (time.time() - self.args.main_at)
            await asyncio.wait([load, stopped], return_when=asyncio.FIRST_COMPLETED,
                               timeout=max(limit, 0.0) if self.args.startup_timeout_s else None)
            stopped.cancel()
            if not load.done() and not self.stop.is_set():
                # Setup code cannot be interrupted either; the process leaves without it (see main()).
                reason = f"setup did not finish within startup_timeout_s ({self.args.startup_timeout_s:g} s)"
                log.error("%s", reason)
                await self._report("crashed", reason)
                return EXIT_SETUP_TIMED_OUT
            if not load.done():
                # Setup code cannot be interrupted; leave without waiting for it (see main()).
                log.info("stopped during setup")
                await self.kv.delete(self.args.replica_id)
                return EXIT_ABANDONED_SETUP
            try:
                endpoints = load.result()
            except Exception as exc:
                log.exception("setup failed")
                # "crashed": the agent restarts it; "failed" is the agent's word once it gives up
                await self._report("crashed", f"setup failed: {type(exc).__name__}: {exc}")
                return EXIT_SETUP_FAILED
            _gc.settle()  # what setup made (the model): never scanned by a full collection while serving
            subs, loops = await self._serve(nc, endpoints)
            self.status = msgspec.structs.replace(self.status, start=self._start_phases())
            self._ready_at = time.time()
            await self._report("ready")
            await self.stop.wait()
            await self._drain(subs, loops)
            await tear_down(self.instance, self.executor)
            return 0
        finally:
            if self.renewal is not None:
                self.renewal.cancel()
            await cancel_and_wait(heartbeat)
            inner.uninstall()
            await nc.drain()
            self.executor.shutdown(wait=False, cancel_futures=True)
            for endpoint in self.endpoints:
                endpoint.close()

    async def _load(self) -> list[Endpoint]:
        imports_at = time.time()
        with warm.Asked() as asked:  # the heavy libraries its app needs: a warm start of its key imports them
            if self.preloaded is not None:
                target, prepared = self.preloaded.target, self.preloaded.prepared
                self.service = self.preloaded.service
            else:
                app = find_app(import_app_module(self.args.bundle, self.args.module), self.args.app)
                self.service, target, prepared = app.services[self.args.service], app.target(self.args.service), None
            setup_at = time.time()
            endpoints, self.instance = await asyncio.get_running_loop().run_in_executor(
                self.executor, build_endpoints, self.service, target, prepared)
        self._phases = (imports_at, setup_at, time.time())
        self._modules = asked.modules() if self.preloaded is None else warm.imported()  # a zygote: all the app's
        return endpoints

    def _start_phases(self) -> StartPhases:
        imports_at, setup_at, done_at = self._phases
        decided = self.args.decided_at or self.args.main_at
        since_decision = max(self.args.main_at - decided - self.args.fetch_s, 0.0)
        pre = self.preloaded
        return StartPhases(kind=self.args.start_kind, fetch_s=self.args.fetch_s,
                           interpreter_s=since_decision if pre is None else 0.0,
                           fork_s=since_decision if pre is not None else 0.0,
                           snap_setup_s=pre.snap_setup_s if pre is not None else 0.0,
                           imports_s=setup_at - imports_at, setup_s=done_at - setup_at, ready_s=time.time() - decided,
                           modules=self._modules)

    async def _serve(self, nc: Any, endpoints: list[Endpoint]) -> tuple[list[Any], list[asyncio.Task[None]]]:
        subs, loops = [], []
        self.answers = Answers(nc, self.args.replica_id)
        self.streams = Streams(nc, self.args.replica_id)
        self.endpoints = endpoints
        group = subjects.replica_group(self.args.app, self.args.service, self.args.version)
        standby = subjects.replica_standby(self.args.replica_id)
        await nc.subscribe(standby, cb=subjects.only_on(standby, self.standby.on_message))
        served: dict[str, tuple[Endpoint, Batcher]] = {}
        on_frame = self._on_frame(served)
        for endpoint in endpoints:
            batcher = batcher_for(endpoint, self.executor, serving(self.args.app, endpoint.spec.name))
            batcher.on_submit = self.activity.set
            self.batchers.append(batcher)
            loops.append(asyncio.create_task(batcher.run_forever(), name=f"batcher-{endpoint.spec.name}"))
            kinds = [False, True] if endpoint.spec.on else [False]
            workers = [QueueWorker(nc.jetstream(), self.calls, self.args.app, endpoint, batcher, self.service.retries,
                                   events=events, standby=self.standby, replica_id=self.args.replica_id)
                       for events in kinds]
            workers.append(QueueWorker(nc.jetstream(), self.calls, self.args.app, endpoint, batcher,  # pinned calls
                                       self.service.retries, pinned=self.args.version,
                                       replica_id=self.args.replica_id))
            for worker in workers:
                self.workers.append(worker)
                self.pullers.append(asyncio.create_task(worker.run(), name=f"queue-{endpoint.spec.name}"))
            served[endpoint.spec.name] = endpoint, batcher
            subject = subjects.invoke(self.args.app, endpoint.spec.name, self.args.version)
            subs.append(await nc.subscribe(subject, queue=group, cb=subjects.only_on(subject, on_frame),
                                           pending_msgs_limit=65536))
        own = subjects.replica_invoke(self.args.replica_id)
        subs.append(await nc.subscribe(own, cb=subjects.only_on(own, on_frame), pending_msgs_limit=65536))
        intake = list(subs)
        loops.append(asyncio.create_task(self._report_load(nc, endpoints), name="load-reports"))
        self._intake = subs, intake
        loops.append(asyncio.create_task(self._watch_stuck(subs, intake), name="stuck-watch"))
        loops.append(asyncio.create_task(health.watch(self.instance, self.stop, functools.partial(
            self._give_way, subs, intake, why="health")), name="health-watch"))
        cancel, credit = subjects.replica_cancel(self.args.replica_id), subjects.replica_credit(self.args.replica_id)
        # not in ``subs`` (gone with the connection): while the replica drains, the calls it still holds may be
        # cancelled (a caller that left, a user's cancel, Ember-Terminate) and its running streams need their credit
        await nc.subscribe(cancel, cb=subjects.only_on(cancel, self._on_cancel))
        await nc.subscribe(credit, cb=subjects.only_on(credit, self._on_credit))
        return subs, loops  # no flush of its own: the ready report, after these on the same connection, flushes

    async def _watch_stuck(self, subs: list[Any], intake: list[Any]) -> None:
        """A call past its ``timeout_s`` was answered 504 by the gateway, but the model thread cannot be
        interrupted: once a batch (or a Continuous step) runs ``STUCK_GRACE_S`` past the timeout, this replica stops
        taking calls, hands back what it holds (callers retry elsewhere) and reports itself stopping, so that the
        control loop starts a replacement and then stops this one (make-before-break)."""
        limit = self.service.timeout_s + STUCK_GRACE_S
        while not self.stop.is_set():
            now = time.monotonic()
            since = [(b, reports.running_since(b, e.steps)) for e, b in zip(self.endpoints, self.batchers, strict=True)]
            stuck = next((b for b, start in since if start is not None and now - start > limit), None)
            if stuck is not None:
                await self._give_way(subs, intake, f"a call of {stuck.name} ran past its timeout_s "
                                                   f"({self.service.timeout_s:g} s) and cannot be interrupted: "
                                                   "this replica is being replaced")
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), STUCK_CHECK_S)

    async def _give_way(self, subs: list[Any], intake: list[Any], reason: str, why: str = "stuck") -> None:
        if self.stuck:  # given way already (stuck, or its health check failed)
            return
        self.status = msgspec.structs.replace(self.status, gave_way=why)
        log.error("%s", reason)
        self.stuck = True  # no more load reports: the gateway stops choosing this replica
        for sub in intake:
            subs.remove(sub)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for worker in self.workers:
            worker.stop.set()
        for batcher in self.batchers:
            batcher.close()
            await batcher.fail_pending(UnavailableError(reason, retry_after_s=0.1))
        await self._report("stopping", reason)

    def _on_frame(self, served: dict[str, tuple[Endpoint, Batcher]]) -> Any:
        """Takes a frame of synchronous calls (see ``ember_platform.calls.router``): each goes to its function's
        batcher, which answers it through ``self.answers``."""
        async def on_frame(msg: Msg) -> None:
            packed = not is_json_frame(msg.data)  # msgpack: binary or msgpack bodies, answered in msgpack
            invocations = decode_frame(msg.data, packed, msg.subject)  # None: not from a gateway, nobody to answer
            for invocation in invocations or ():
                try:
                    self._take(msg.reply, invocation, served.get(invocation.function), packed)
                except Exception as exc:  # every call of the frame is answered, whatever became of the others
                    log.exception("could not take call %s", invocation.call_id)
                    error = EmberError(f"the replica could not take the call: {type(exc).__name__}: {exc}")
                    self.answers.answer(msg.reply, answer_of(invocation.call_id, None, error, 0), packed)

        return on_frame

    def _take(self, reply: str, invocation: Invocation, served: tuple[Endpoint, Batcher] | None,
              packed: bool = False) -> None:
        call_id = invocation.call_id
        codec, compact = ("msgpack" if packed else "json"), invocation.compact and declared_output(served)
        span: Any = None  # its ``ember.call`` span, when tracing is on

        async def answer(output: Any, error: EmberError | None, batch_size: int) -> None:
            self.answers.answer(reply, answer_of(call_id, output, error, batch_size, codec, compact), packed)
            if span is not None:
                spans.answered(span, error)

        if served is None:
            error = NotFoundError(f"replica {self.args.replica_id} serves no function {invocation.function!r}")
            self.answers.answer(reply, answer_of(call_id, None, error, 0, codec), packed)
            return
        endpoint, batcher = served
        if endpoint.spec.stream:
            self._take_stream(reply, invocation, endpoint, batcher, codec)
            return
        self.answers.hold(reply, call_id, packed)
        if tracing.ON:
            span = spans.call(invocation.trace, call_id, invocation.function)
        try:
            value = endpoint.decode(invocation.input, codec)
            batcher.submit(Call(value, invocation.deadline, answer, call_id, "interactive",
                                endpoint.cost_of(value), chain=invocation.chain, span=span))
        except EmberError as exc:
            if span is not None:
                spans.answered(span, exc)
            self.answers.answer(reply, answer_of(call_id, None, exc, 0, codec), packed)

    def _take_stream(self, reply: str, invocation: Invocation, endpoint: Endpoint, batcher: Batcher,
                     codec: str) -> None:
        """A call of a generator: accepted at once (``ember.wire.streams``), its items sent as they come."""
        sink = self.streams.open(reply, invocation.call_id, invocation.deadline, invocation.bundles)
        finish: Any = sink.finish
        span: Any = None
        if tracing.ON:  # its ``ember.call`` lasts until the stream's end
            span = spans.call(invocation.trace, invocation.call_id, invocation.function,
                              attributes={"ember.stream": True})
            finish = spans.ending(span, sink.finish) if span is not None else finish
        try:
            args, kwargs = endpoint.decode(invocation.input, codec)
            batcher.submit(Call(Streamed(args, kwargs, sink), invocation.deadline, finish, invocation.call_id,
                                "interactive", chain=invocation.chain, span=span))
        except Exception as exc:  # an accepted stream always ends: here with its call's error
            error = exc if isinstance(exc, EmberError) else EmberError(f"the replica could not take the call: {exc}")
            asyncio.get_running_loop().create_task(finish(None, error, 0))

    async def _report_load(self, nc: Any, endpoints: list[Endpoint]) -> None:
        """Publish each function's queue and in-flight counts a few times a second, until draining (or stuck): a
        changed report at once (within ``LOAD_REPORT_S``), the same one again only when due (``report_due``)."""
        sent: dict[str, tuple[LoadReport, float]] = {}
        while not self.stop.is_set() and not self.stuck:
            for endpoint, batcher in zip(endpoints, self.batchers, strict=True):
                cap = batcher.capacity
                report = LoadReport(replica_id=self.args.replica_id, app=self.args.app, function=endpoint.spec.name,
                                    version=self.args.version, queued=batcher.queued,
                                    in_flight=reports.in_flight(batcher, endpoint.steps),
                                    per_call_s=batcher.model.predict(cap) / (cap * batcher.slots),
                                    slots=batcher.slots, accepted=self.streams.accepted)
                now = time.monotonic()
                if not report_due(report, sent.get(endpoint.spec.name), now):
                    continue
                sent[endpoint.spec.name] = report, now
                with contextlib.suppress(Exception):
                    await nc.publish(subjects.stats(self.args.app, endpoint.spec.name), encoder.encode(report))
            await self._next_report(idle=all(b.queued == 0 and reports.in_flight(b, e.steps) == 0
                                             for e, b in zip(endpoints, self.batchers, strict=True)))

    async def _next_report(self, idle: bool) -> None:
        """Wait ``LOAD_REPORT_S`` while calls are held; an idle replica waits until a call is queued (its report then
        goes at once) or its unchanged report is due again (``IDLE_REPORT_S``), without waking in between."""
        if not idle:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), LOAD_REPORT_S)
            return
        self.activity.clear()
        waits = [asyncio.ensure_future(self.stop.wait()), asyncio.ensure_future(self.activity.wait())]
        try:
            await asyncio.wait(waits, timeout=IDLE_REPORT_S + 0.01, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    async def _on_cancel(self, msg: Msg) -> None:
        """A call whose caller went away, or cancelled (``calls.durable``): see ``Batcher.withdraw``. With
        ``Ember-Terminate: 1`` a call running here also makes the replica leave as if it crashed, its other calls
        handed back first. Only a call held here has any effect."""
        call_id = msg.data.decode(errors="replace")
        self.streams.cancel(call_id)  # a stream is running, or queued in its batcher too
        for batcher in self.batchers:
            where = await batcher.withdraw(call_id)
            if where == "running" and (msg.headers or {}).get(TERMINATE_HEADER) == "1" and not self.stuck:
                await self._give_way(*self._intake, f"call {call_id} of {batcher.name} was cancelled with "
                                                    "terminate: this replica is being replaced")
                for worker in self.workers:  # its other calls: redelivered elsewhere at once, as after a crash
                    await worker.hand_back()
                await self.answers.drain()
                await natsflush.flush(msg._client)
                os._exit(EXIT_TERMINATED)  # sync code may never return: leave without it (the agent restarts it)
            if where:
                return

    async def _on_credit(self, msg: Msg) -> None:
        try:
            credit = credit_decoder.decode(msg.data)
        except msgspec.DecodeError:
            return
        self.streams.grant(credit.call_id, credit.upto)

    async def _drain(self, subs: list[Any], loops: list[asyncio.Task[None]]) -> None:
        """Stop intake (HTTP subjects and queue pulls), finish what is held within the grace period,
        then hand back the rest: sync callers are told to retry, queued calls are nak'ed for redelivery."""
        await self._report("stopping")
        for sub in subs:
            await sub.unsubscribe()
        for worker in self.workers:
            worker.stop.set()
        await asyncio.gather(*self.pullers, return_exceptions=True)
        for batcher in self.batchers:
            batcher.close()
        now, limit = time.monotonic(), self.service.timeout_s + STUCK_GRACE_S
        stuck = {f"batcher-{b.name}" for b in self.batchers if b.running_since and now - b.running_since > limit}
        # ^ batches past their calls' timeout cannot finish in any grace: not waited for
        waited = [task for task in loops if task.get_name() not in stuck]
        _, pending = await asyncio.wait(waited, timeout=DRAIN_GRACE_S) if waited else (set(), set())
        for task in {*pending, *(task for task in loops if task.get_name() in stuck)}:
            task.cancel()
        await asyncio.gather(*loops, return_exceptions=True)
        for batcher in self.batchers:  # past the grace period: callers retry elsewhere at once
            await batcher.fail_pending(UnavailableError("the replica stopped before running the call",
                                                        retry_after_s=0.1))
        for worker in self.workers:
            await worker.finish()
        self.streams.cancel_all()  # a stream still running past the grace period: its caller sees it end early
        await self.streams.drain()
        await self.answers.drain()
        await self.kv.delete(self.args.replica_id)

    async def _report(self, state: str, message: str = "") -> None:
        self.status = msgspec.structs.replace(self.status, state=state, message=message)  # type: ignore[arg-type]
        await self._put()

    async def _put(self, beat: bool = False) -> None:
        """Write the status; ``beat``: the heartbeat's write, skipped while nothing changed (``heartbeat_due``)."""
        steps = {e.spec.name: e.steps.running for e in self.endpoints if e.steps is not None}
        stats = [b.metrics.snapshot(b.name, b.queued, b.in_flight, steps.get(b.name)) for b in self.batchers]
        first = min((b.metrics.first_batch_at for b in self.batchers if b.metrics.first_batch_at), default=None)
        start = self.status.start
        if start is not None and start.first_call_s is None and first is not None:
            self.status = msgspec.structs.replace(
                self.status, start=msgspec.structs.replace(start, first_call_s=max(first - self._ready_at, 0.0)))
        status = msgspec.structs.replace(self.status, calls=sum(s.calls for s in stats),
                                         batches=sum(s.batches for s in stats), functions=stats)
        now = time.time()
        if beat and not heartbeat_due(status, self.status, self._repeats, now):
            return
        self._repeats = self._repeats + 1 if beat and status == self.status else 0
        self.status = msgspec.structs.replace(status, updated_at=now)
        await self.kv.put(self.args.replica_id, encoder.encode(self.status))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self._put(beat=True)
            except Exception as exc:
                log.warning("heartbeat failed: %s", exc)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The replica's arguments, with ``main_at``: when it began (the interpreter and Ember's modules are
    loaded by then, or the fork is done); and its logging set up."""
    main_at = time.time()
    args = arguments.parse(argv)
    args.main_at = main_at
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s",
                        force=True)
    return args


async def serve(args: argparse.Namespace, preloaded: Preloaded | None = None,
                executor: ModelThread | None = None) -> int:
    """Run a replica on the running loop until SIGTERM; ``preloaded`` (and ``executor``) when it was forked from a
    zygote (``ember_runtime.zygote``). Its NATS credentials leave the environment before any app code runs."""
    creds = take_from_env()
    replica = Replica(args, preloaded, executor)
    replica.connect(creds)
    tracing.setup("ember-replica", {"ember.app": args.app, "ember.service": args.service, "ember.version": args.version,
                                    "ember.replica_id": args.replica_id, "ember.node_id": args.node_id,
                                    "service.instance.id": args.replica_id})
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, replica.stop.set)
    if args.exit_with:
        lifeline.exit_with(loop, args.exit_with, replica.stop)
    agent = lifeline.watch(replica.stop)  # a fresh replica outlives its agent for a while (see ``lifeline``)
    try:
        return await replica.run(creds)
    finally:
        if agent is not None:
            agent.cancel()
            await asyncio.gather(agent, return_exceptions=True)
        tracing.shutdown()  # the last spans, flushed before the process leaves


def main(argv: list[str] | None = None) -> int:
    """Run a replica in a fresh interpreter, started by the node agent."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    code = ember_loop.run(serve(args))
    busy = any(t.is_alive() and not t.daemon for t in threading.enumerate() if t is not threading.main_thread())
    if code in (EXIT_ABANDONED_SETUP, EXIT_SETUP_TIMED_OUT) or busy:
        # the setup, or a call past its timeout (stuck), still runs on the model thread: leave without waiting for it
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
    return code
