"""Calls between functions: a replica's code calls another function through its control plane, over NATS.

A replica publishes requests (``ember.wire.relay``) on ``ember.relay.<replica id>``, the one relay subject its NATS
permissions allow, so the subject names the caller; every control plane answers from one queue group. A replica
never publishes another app's invoke subjects: this is where a call between functions is checked, as the gateway
checks an HTTP call, before it is routed the gateway's way (``Router``) or queued (``Calls``):

- **who may call whom**: a replica of app A may call A's own functions, the functions of the apps A's manifest
  names (``App("a", calls=["b"])``: its pusher needed ``invoke`` on each), and any ``public=True`` function
  synchronously; nothing else (403). Records and cancels of spawned calls: A's own and those of the apps it names.
- **input**: validated against the target's schema, as at the gateway (400/422 naming the field).
- **deadline**: the caller's (the deadline its own call carries), capped by the target's ``timeout_s``; a call whose
  caller is already out of time is refused (504) and never sent.
- **chain**: the callee receives the calls waiting on it (outermost first, the caller last); a call to a service
  already in that chain (``a`` calls ``b`` calls ``a``) is refused (409 ``call_cycle``), since the replicas of
  ``a`` may all be held by the calls waiting on it; so is a chain deeper than ``MAX_CHAIN``. A spawned call starts
  a chain of its own (its caller does not wait on it).
- **generator functions**: their items come back collected into one list, as a queued call stores them.
- **room**: the requests that hold a task for long (a call, a record's long poll) are bounded per control plane
  (``MAX_IN_FLIGHT``) and per app (``MAX_IN_FLIGHT_PER_APP``: one app's replicas cannot take every other app's
  room); the short ones (a spawn, a cancel, a queue worker's take or read of its own call) are never refused for
  room, so that one app's waits do not stall every app's queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import msgspec
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.js.kv import KeyValue

from ember import _tracing as tracing
from ember._errors import (
    BadRequestError,
    CallCancelledError,
    CallCycleError,
    DeadlineExceededError,
    EmberError,
    ForbiddenError,
    NotFoundError,
    OverloadedError,
    PayloadTooLargeError,
    error_class,
)
from ember._loop import cancel_and_wait
from ember.wire import (
    Deployment,
    FunctionSpec,
    NodeAssignment,
    ServiceSpec,
    SlotAssignment,
    assignment_decoder,
    encoder,
    subjects,
)
from ember.wire.calls import Hop
from ember.wire.errors import error_info
from ember.wire.jetstream import KVMirror
from ember.wire.natscreds import replica_inbox
from ember.wire.relay import (
    MAX_CHAIN,
    RelayCallRead,
    RelayCallTake,
    RelayCancel,
    RelayInvoke,
    RelayRecord,
    RelayReply,
    RelayRequest,
    RelaySpawn,
    TakeReply,
    request_decoder,
)
from ember_platform.calls.durable import MAX_CALL_ID, Calls, check_call_id, no_such_call
from ember_platform.calls.lineage import Lineage
from ember_platform.calls.router import Router
from ember_platform.calls.streams import CallStream, Streams
from ember_platform.control.registry import Registry
from ember_platform.gateway.body import Validators
from ember_platform.gateway.fresh_reads import FreshReads
from ember_platform.quotas.limiter import Limiter

log = logging.getLogger("ember.relay")
QUEUE = "ember-relay"
MAX_IN_FLIGHT = 10_000  # relayed calls and long polls one control plane holds at once; more are refused (429)
MAX_IN_FLIGHT_PER_APP = MAX_IN_FLIGHT // 4  # of which one app's replicas (429 past it)
MAX_RECORD_WAIT_S = 300.0
MAX_KEY = 256
MAX_COLLECTED_BYTES = 64 * 1024 * 1024  # a generator function's items, collected for a caller (as over HTTP)


class Room:
    """How many requests that hold a task for long (calls, long polls) a control plane serves at once, in all
    (``total``) and for one app's replicas (``per_app``)."""

    def __init__(self, total: int = MAX_IN_FLIGHT, per_app: int = MAX_IN_FLIGHT_PER_APP) -> None:
        self.total, self.per_app = total, per_app
        self._held: Counter[str] = Counter()

    def take(self, app: str) -> str:
        """Count one more of ``app``'s, if there is room: "" then; else why not (the answer's message)."""
        if self._held.total() >= self.total:
            return f"this control plane relays {self._held.total()} calls and waits already; retry shortly"
        if self._held[app] >= self.per_app:
            return f"app {app!r} has {self._held[app]} calls and waits relayed here already; retry shortly"
        self._held[app] += 1
        return ""

    def give_back(self, app: str) -> None:
        self._held[app] -= 1
        if self._held[app] <= 0:
            del self._held[app]


@dataclass(frozen=True)
class Caller:
    """Who sent a relay request: the replica's slot (as the scheduler assigned it) and its app's deployment."""

    slot: SlotAssignment
    deployment: Deployment

    @property
    def app(self) -> str:
        return self.slot.app

    def may_call(self, app: str) -> bool:
        """Whether this caller's app may call (spawn, read the calls of) ``app``'s functions."""
        return app == self.app or app in self.deployment.manifest.calls


class Relay:
    """Answers the relay subjects of every replica (one queue group of the control planes)."""

    def __init__(self, nc: Client, registry: Registry, validators: Validators, router: Router, calls: Calls,
                 limiter: Callable[[], Limiter], assignments: KeyValue, streams: Streams) -> None:
        self._nc = nc
        self._registry = registry
        self._validators = validators
        self._router = router
        self._calls = calls
        self._limiter = limiter
        self._streams = streams
        self._assignments_kv = assignments
        self._assignments = KVMirror(assignments, assignment_decoder.decode, on_change=self._index)
        self._fresh = FreshReads(self._read_assignments)  # for a replica the mirror does not know yet
        self._slots: dict[str, SlotAssignment] = {}  # replica id -> its slot, for every node's assignment
        self._of_node: dict[str, list[str]] = {}  # node id -> the replica ids of its assignment
        self._sub: Subscription | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self.room = Room()  # for the requests that hold a task for long
        self.lineage = Lineage()  # the calls each call made: cancelled with it

    async def start(self) -> None:
        await self._assignments.start()
        await self.lineage.start(self._nc)
        self._sub = await self._nc.subscribe(subjects.RELAY_ALL, queue=QUEUE,
                                             cb=subjects.only_on(subjects.RELAY_ALL, self._on_request),
                                             pending_msgs_limit=65536)

    async def stop(self) -> None:
        """Stop taking requests; the calls in flight are cancelled (their callers get no answer and time out)."""
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()
        await cancel_and_wait(*self._tasks)
        await self.lineage.stop()
        await self._assignments.stop()

    async def _on_request(self, msg: Msg) -> None:
        if not _answerable(msg):
            return
        replica_id = msg.subject[len("ember.relay."):]
        try:
            request = _decode(msg.data)
        except EmberError as exc:
            await self._respond(msg, RelayReply(error=error_info(exc)))
            return
        holder = None
        if isinstance(request, RelayInvoke) or (isinstance(request, RelayRecord) and request.wait_s > 0):
            slot = self._slots.get(replica_id)
            holder = slot.app if slot is not None else f"replica {replica_id}"  # (not mirrored yet: its own)
            if busy := self.room.take(holder):
                await self._respond(msg, RelayReply(error=error_info(OverloadedError(busy, retry_after_s=1.0))))
                return
        work = self._serve(msg, replica_id, request)
        task = asyncio.create_task(tracing.within("ember.relay", msg.headers, work) if tracing.ON else work,
                                   name="relay")  # a call may take its whole deadline
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if holder is not None:
            task.add_done_callback(lambda _task: self.room.give_back(holder))

    async def _serve(self, msg: Msg, replica_id: str, request: RelayRequest) -> None:
        try:
            caller = await self._caller(replica_id)
            reply = RelayReply(output=msgspec.Raw(await self.handle(caller, request)))
        except EmberError as exc:
            reply = RelayReply(error=error_info(exc))
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is None or not self.lineage.was_cancelled(task):
                raise  # the control plane stops
            task.uncancel()
            reply = RelayReply(error=error_info(CallCancelledError("the call that made this call was cancelled")))
        except Exception as exc:  # never leave the caller without an answer
            log.exception("relaying a call from replica %s failed", replica_id[:80])
            reply = RelayReply(error=error_info(EmberError(f"the control plane could not relay the call: {exc}")))
        await self._respond(msg, reply)

    async def _respond(self, msg: Msg, reply: RelayReply) -> None:
        answer = encoder.encode(reply)
        if len(answer) > self._nc.max_payload:  # told at once, not left to time out
            answer = encoder.encode(RelayReply(error=error_info(PayloadTooLargeError(
                f"the answer of {len(answer)} bytes is over the {self._nc.max_payload}-byte limit of a NATS message"))))
        try:
            await msg.respond(answer)
        except Exception as exc:  # the caller times out at its deadline
            log.warning("could not answer a relayed call on %s: %s", msg.reply, exc)

    async def handle(self, caller: Caller, request: RelayRequest) -> bytes:
        """What the HTTP route would answer on success (raw JSON); an ``EmberError`` otherwise."""
        if isinstance(request, RelayInvoke):
            return await self._invoke(caller, request)
        if isinstance(request, RelaySpawn):
            return await self._spawn(caller, request)
        if isinstance(request, RelayRecord):
            return await self._record(caller, request)
        if isinstance(request, RelayCallRead):
            return await self._read(caller, request)
        if isinstance(request, RelayCallTake):
            return await self._take(caller, request)
        return await self._cancel(caller, request)

    # -- the verbs -----------------------------------------------------------------------------------

    async def _invoke(self, caller: Caller, req: RelayInvoke) -> bytes:
        dep, svc, fn = self._target(caller, req.app, req.function, sync=True)
        chain = callee_chain(caller, req, dep.app, fn.name)
        now = time.time()
        deadline = now + svc.timeout_s
        if req.deadline:
            if not math.isfinite(req.deadline):
                raise BadRequestError("deadline is seconds since the epoch, or 0 for none", field="deadline")
            if req.deadline <= now:
                raise DeadlineExceededError(f"no time is left of the caller's deadline to call {dep.app}.{fn.name}")
            deadline = min(deadline, req.deadline)
        body = self._validators.of(dep, fn).check(bytes(req.input))
        held = self._limiter().admit(dep.app, "")  # the app's quotas count calls from functions too
        call_id = os.urandom(16).hex()
        try:
            with self.lineage.made_by(caller.app, *(req.caller_call_ids or [req.caller_call_id])):  # a batch's: all
                answer = await self._invoke_as(dep, fn, body, call_id, deadline, chain)
        except asyncio.CancelledError:
            self.lineage.cancel(dep.app, call_id)  # and the calls it made
            raise
        finally:
            if held is not None:
                held.release()
        if isinstance(answer, bytes):
            return answer
        if answer.error is not None:
            raise error_class(answer.error.code)(answer.error.message, field=answer.error.field,
                                            retry_after_s=answer.error.retry_after_s,
                                            remote_type=answer.error.type, call_id=call_id)
        return bytes(answer.output)

    async def _invoke_as(self, dep: Deployment, fn: FunctionSpec, body: bytes, call_id: str, deadline: float,
                         chain: list[Hop]) -> Any:
        if fn.stream:  # a generator function: its items, collected into one list
            return await self._collected(self._streams.open(dep.app, fn.name, dep.version, body, call_id=call_id,
                                                            deadline=deadline, chain=chain))
        return await self._router.call(dep.app, fn.name, dep.version, body, call_id=call_id, deadline=deadline,
                                       chain=chain)

    @staticmethod
    async def _collected(stream: CallStream) -> bytes:
        """A generator function's items as one JSON list (at most ``MAX_COLLECTED_BYTES``), as a queued call's."""
        try:
            await stream.start()
            parts: list[bytes] = []
            size = 2
            while (items := await stream.next_items()) is not None:
                parts += [bytes(item) for item in items]
                size += sum(len(item) + 1 for item in items)
                if size > MAX_COLLECTED_BYTES:
                    raise PayloadTooLargeError(f"the items are over {MAX_COLLECTED_BYTES} bytes, the most collected "
                                               "for a call between functions", call_id=stream.call_id)
            return b"[" + b",".join(parts) + b"]"
        finally:
            await stream.aclose()

    async def _spawn(self, caller: Caller, req: RelaySpawn) -> bytes:
        dep, _, fn = self._target(caller, req.app, req.function, sync=False)
        if self.lineage.all_cancelled(caller.app, req.caller_call_ids):  # its cancel passed the request on the way
            raise CallCancelledError(f"the call spawning {dep.app}.{fn.name} was cancelled: it spawns nothing",
                                     call_id=req.caller_call_ids[0])
        deadline = math.inf
        if req.timeout_s is not None:
            if not 0 < req.timeout_s < math.inf:
                raise BadRequestError("timeout_s is a positive number of seconds", field="timeout_s")
            deadline = time.time() + req.timeout_s
        key = req.idempotency_key
        if key is not None and not 0 < len(key) <= MAX_KEY:
            raise BadRequestError(f"an idempotency key is 1 to {MAX_KEY} characters", field="idempotency_key")
        body = self._validators.of(dep, fn).check(bytes(req.input))
        held = self._limiter().admit(dep.app, "")
        try:
            reply = await self._calls.submit(dep.app, fn.name, body, key=key, deadline=deadline)
        finally:
            if held is not None:
                held.release()
        return encoder.encode(reply)

    async def _record(self, caller: Caller, req: RelayRecord) -> bytes:
        check_call_id(req.call_id)
        if not 0 <= req.wait_s <= MAX_RECORD_WAIT_S:
            raise BadRequestError(f"wait_s is 0 to {MAX_RECORD_WAIT_S:g} seconds", field="wait_s")
        record = await self._calls.get(req.call_id)
        if not caller.may_call(record.app):
            raise no_such_call(req.call_id)  # as for an unknown call: nothing learnt of other apps' calls
        if req.wait_s > 0:
            record = await self._calls.get(req.call_id, req.wait_s)
        return encoder.encode(record)

    async def _read(self, caller: Caller, req: RelayCallRead) -> bytes:
        """A queued call's status or final record, of the caller's own app alone (its key names that app)."""
        check_call_id(req.call_id)
        store = self._calls.store
        if req.kind == "s":
            record = await store.status(caller.app, req.call_id)
        else:
            record = await store.result(caller.app, req.call_id, output=req.output)
        if record is None or (record.app, record.call_id) != (caller.app, req.call_id):
            return b"null"
        return encoder.encode(record)

    async def _take(self, caller: Caller, req: RelayCallTake) -> bytes:
        """A queued call of the caller's own app taken by the calling replica (``CallStore.take``)."""
        check_call_id(req.call_id)
        if not 1 <= req.attempt <= 2**31:
            raise BadRequestError("attempt is a delivery count from 1", field="attempt")
        record, finished = await self._calls.store.take(caller.app, req.call_id, req.function, req.attempt,
                                                        caller.slot.replica_id)
        return encoder.encode(TakeReply(record=record, finished=finished))

    async def _cancel(self, caller: Caller, req: RelayCancel) -> bytes:
        record = await self._calls.get(check_call_id(req.call_id))
        if not caller.may_call(record.app):
            raise no_such_call(req.call_id)
        return encoder.encode(await self._calls.cancel(req.call_id, by=f"app {caller.app}"))

    # -- the checks ----------------------------------------------------------------------------------

    def _target(self, caller: Caller, app: str, function: str, *,
                sync: bool) -> tuple[Deployment, ServiceSpec, FunctionSpec]:
        """The function called, its service and deployment, if the caller may call it (else 403: the same whether the
        app or the function exists or not, where the caller may not call that app)."""
        if caller.may_call(app):
            if app == caller.app:  # its own app: the version its code is, while that runs (during a rollout or a
                # canary, the split would send a new version's call of a new function to the old one, which lacks it)
                with contextlib.suppress(NotFoundError):
                    return self._registry.route(app, function, caller.slot.version, random.random())
            return self._registry.route(app, function, None, random.random())  # the version the split draws
        try:
            dep, svc, fn = self._registry.route(app, function, None, random.random())
        except NotFoundError:
            fn = None
        if sync and fn is not None and fn.public:
            return dep, svc, fn
        raise ForbiddenError(f"app {caller.app!r} may not call {app}.{function}: name {app!r} in "
                             f"App({caller.app!r}, calls=[...]) and push it with a token that may invoke it",
                             field="app")

    async def _caller(self, replica_id: str) -> Caller:
        slot = self._slot(replica_id) or await self._fresh_slot(replica_id)
        if slot is None:
            raise ForbiddenError(f"replica {replica_id[:80]!r} is not assigned: it may call no function")
        dep = self._registry.deployments.items.get(slot.app)
        if dep is None:
            raise ForbiddenError(f"app {slot.app!r} is not deployed: its replicas may call no function")
        return Caller(slot, dep.at(slot.version) or dep)  # the version the replica runs (during a rollout, an old one)

    def _index(self, node_id: str, assignment: NodeAssignment | None) -> None:
        for replica_id in self._of_node.pop(node_id, ()):
            self._slots.pop(replica_id, None)
        if assignment is not None:
            self._slots.update((slot.replica_id, slot) for slot in assignment.slots)
            self._of_node[node_id] = [slot.replica_id for slot in assignment.slots]

    def _slot(self, replica_id: str) -> SlotAssignment | None:
        return self._slots.get(replica_id)

    async def _fresh_slot(self, replica_id: str) -> SlotAssignment | None:
        """Read the assignments again: this control plane's mirror may not have seen a replica just assigned. One
        read for every request that waits on it (``FreshReads``), not one each."""
        try:
            return _find(await self._fresh.fresh(), replica_id)
        except TimeoutError:  # the assignments could not be read in time: not known, as when a read failed
            return None

    async def _read_assignments(self) -> list[NodeAssignment]:
        found: list[NodeAssignment] = []
        with contextlib.suppress(Exception):
            for key in await self._assignments_kv.keys():
                entry = await self._assignments_kv.get(key)
                if entry.value:
                    found.append(assignment_decoder.decode(entry.value))
        return found


def _answerable(msg: Msg) -> bool:
    """Whether ``msg`` is a replica's request to answer: on its own relay subject, with a reply subject in that
    replica's own inbox. Anything else is dropped unanswered: an answer goes wherever a request's reply subject
    says, and a reply subject is not checked by NATS' permissions, so an answer to another subject (a key of a
    bucket, another client's subscription) would be written there with this control plane's permissions."""
    replica_id = msg.subject.removeprefix("ember.relay.")
    if not msg.reply or replica_id == msg.subject or not subjects.is_token(replica_id):
        return False
    return msg.reply.startswith(f"{replica_inbox(replica_id)}.")


def callee_chain(caller: Caller, req: RelayInvoke, app: str, function: str) -> list[Hop]:
    """The chain the callee ``app.function`` receives: the caller's, then the caller; ``CallCycleError`` when the
    callee's service already waits in it (or it grows past ``MAX_CHAIN``), ``BadRequestError`` when the caller claims
    a function its replica does not serve."""
    served = next((s for s in caller.deployment.manifest.services if s.name == caller.slot.service), None)
    if req.caller_function and (served is None or req.caller_function not in {f.name for f in served.functions}):
        raise BadRequestError(f"replica of {caller.app}.{caller.slot.service} does not serve "
                              f"{req.caller_function[:80]!r}", field="caller_function")
    if len(req.caller_call_id) > MAX_CALL_ID or any(len(h.app) > 63 or len(h.function) > 257
                                                    or len(h.call_id) > MAX_CALL_ID for h in req.chain):
        raise BadRequestError("a hop of the chain names no app, function or call id Ember could have given",
                              field="chain")
    here = Hop(app=caller.app, function=req.caller_function or caller.slot.service, call_id=req.caller_call_id)
    chain = [*req.chain, here]
    if len(chain) > MAX_CHAIN:
        raise CallCycleError(f"calls between functions nest at most {MAX_CHAIN} deep: "
                             f"{_shown(chain[-MAX_CHAIN:])} -> {app}.{function}")
    if any((hop.app, _service_of(hop.function)) == (app, _service_of(function)) for hop in chain):
        raise CallCycleError(f"call cycle: {_shown(chain)} -> {app}.{function}: {app}.{function} (or its service) "
                             "already waits in this chain, so its replicas could all be held by the calls waiting on "
                             "it; call it from outside the chain, or .spawn() it")
    return chain


def _find(assignments: Iterable[NodeAssignment], replica_id: str) -> SlotAssignment | None:
    for assignment in assignments:
        for slot in assignment.slots:
            if slot.replica_id == replica_id:
                return slot
    return None


def _decode(data: bytes) -> RelayRequest:
    try:
        return request_decoder.decode(data)
    except msgspec.ValidationError as exc:
        raise BadRequestError(f"not a relay request: {exc}") from None
    except msgspec.DecodeError as exc:
        raise BadRequestError(f"malformed relay request: {exc}") from None
    except RecursionError:  # nested deeper than a decoder goes (its input, say): the request's fault, not ours
        raise BadRequestError("malformed relay request: nested too deeply") from None


def _service_of(function: str) -> str:
    """The service that serves ``function`` (``Class.method`` -> ``Class``): the replicas it holds."""
    return function.split(".", 1)[0]


def _shown(chain: list[Hop]) -> str:
    return " -> ".join(f"{hop.app}.{hop.function}" for hop in chain)
