"""The control loop asks JetStream for each function's queued backlog (a consumer info, one API request each) at
every tick while calls wait, but an empty queue only every ``PENDING_IDLE_ASK_S``, unless a call was submitted to
it through this control plane since (an idle platform's CPU was mostly such requests)."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

from support.builders import deployment, service_spec

from ember_platform.control import loop as control_loop
from ember_platform.control import pace
from ember_platform.control.loop import PENDING_IDLE_ASK_S, ControlLoop


class FakeJs:
    """Counts consumer infos; ``waiting`` calls are pending in every queue."""

    def __init__(self) -> None:
        self.asked = 0
        self.waiting = 0

    async def consumer_info(self, _stream: str, _name: str) -> SimpleNamespace:
        self.asked += 1
        return SimpleNamespace(num_pending=self.waiting, num_ack_pending=0)


def _loop(js: FakeJs) -> ControlLoop:
    calls = SimpleNamespace(submitted=Counter())
    return ControlLoop(registry=SimpleNamespace(calls=calls), stores=None,  # type: ignore[arg-type]
                       gateway_load=lambda *_: 0, gateway_received=lambda *_: 0, gateway_capacity=lambda *_: None,
                       js=js)


def test_an_empty_queue_is_asked_rarely_a_busy_one_every_tick(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(control_loop.time, "monotonic", lambda: now[0])
    js = FakeJs()
    loop = _loop(js)
    deps = {"a": deployment(service_spec("f"))}

    def tick() -> None:
        asyncio.run(loop._refresh_pending(deps))
        now[0] += pace.TICK_S

    tick()
    assert js.asked == 1 and loop.pending[("a", "f")] == 0
    for _ in range(int(PENDING_IDLE_ASK_S / pace.TICK_S) - 1):
        tick()
    assert js.asked == 1  # empty: not asked again within the idle period
    tick()
    assert js.asked == 2

    loop.registry.calls.submitted[("a", "f")] += 1  # a spawn through this control plane: asked at the next tick
    js.waiting = 5
    tick()
    assert js.asked == 3 and loop.pending[("a", "f")] == 5
    tick()
    tick()
    assert js.asked == 5  # calls wait: asked every tick until the queue is empty again
    js.waiting = 0
    tick()
    tick()
    assert js.asked == 6 and loop.pending[("a", "f")] == 0
