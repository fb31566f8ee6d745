"""Sends a synchronous call to a replica over NATS and waits for its reply within the deadline."""

from __future__ import annotations

import asyncio
import time

from ember import _subjects as subjects
from ember._errors import DeadlineExceededError, UnavailableError
from ember._wire import CALL_ID_HEADER, DEADLINE_HEADER, PRIORITY_HEADER, CallReply, reply_decoder
from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeoutError

_NO_REPLICA_POLL_S = 0.05


class Router:
    """Routes calls to ``ember.invoke.<tenant>.<app>.<fn>.<version>``, served by a queue group of replicas.

    While no replica is subscribed (NATS answers "no responders" at once) the call waits for one until
    its deadline, so that calls made during a cold start or a restart are not lost.
    """

    def __init__(self, nc: Client) -> None:
        self._nc = nc

    async def call(self, app: str, function: str, version: int, body: bytes, *, call_id: str,
                   deadline: float) -> CallReply:
        subject = subjects.invoke(app, function, version)
        headers = {CALL_ID_HEADER: call_id, DEADLINE_HEADER: repr(deadline), PRIORITY_HEADER: "interactive"}
        while True:
            remaining = deadline - time.time()
            if remaining <= 0:
                raise UnavailableError(f"no replica of {app}.{function} became ready before the deadline",
                                       retry_after_s=1.0, call_id=call_id)
            try:
                msg = await self._nc.request(subject, body, timeout=remaining, headers=headers)
            except NoRespondersError:
                await asyncio.sleep(min(_NO_REPLICA_POLL_S, max(remaining, 0)))
                continue
            except NatsTimeoutError:
                raise DeadlineExceededError(f"{app}.{function} did not answer within its deadline",
                                            call_id=call_id) from None
            return reply_decoder.decode(msg.data)
