"""The relay's reads of every node's assignment for a replica its mirror does not know: a burst of such requests
shares reads, and each request's answer comes from a read that started after it asked (one running before may not
see a replica assigned a moment ago)."""

from __future__ import annotations

import asyncio

import pytest

from ember_platform.gateway.fresh_reads import FreshReads


class Counted:
    """A read that takes a while and says which read it was."""

    def __init__(self) -> None:
        self.started = 0

    async def __call__(self) -> int:
        self.started += 1
        mine = self.started
        await asyncio.sleep(0.05)
        return mine


def test_a_burst_of_requests_costs_two_reads_not_one_each() -> None:
    async def main() -> tuple[int, set[int]]:
        read = Counted()
        reads = FreshReads(read)
        answers = await asyncio.gather(*(reads.fresh() for _ in range(200)))
        return read.started, set(answers)

    started, answers = asyncio.run(main())
    assert started == 1 and answers == {1}  # all asked before any read ran: one read


def test_who_asks_while_a_read_runs_gets_the_next_one() -> None:
    async def main() -> tuple[int, int, int, int]:
        read = Counted()
        reads = FreshReads(read)
        first = asyncio.ensure_future(reads.fresh())
        await asyncio.sleep(0.01)  # read 1 runs
        late = [asyncio.ensure_future(reads.fresh()) for _ in range(50)]
        return await first, min(await asyncio.gather(*late)), max(await asyncio.gather(*late)), read.started

    first, late_min, late_max, started = asyncio.run(main())
    assert first == 1 and late_min == late_max == 2 and started == 2


async def _gone() -> None:
    raise OSError("NATS is gone")


async def _stuck() -> None:
    await asyncio.Event().wait()  # never: past READ_TIMEOUT_S


@pytest.mark.parametrize(("first", "error"), [(_gone, OSError), (_stuck, TimeoutError)])
def test_a_read_that_fails_or_never_returns_fails_its_callers_and_the_next_one_reads_again(
        monkeypatch, first, error) -> None:
    monkeypatch.setattr("ember_platform.gateway.fresh_reads.READ_TIMEOUT_S", 0.05)

    async def main() -> int:
        calls = 0

        async def read() -> int:
            nonlocal calls
            calls += 1
            if calls == 1:
                await first()
            return calls

        reads = FreshReads(read)
        with pytest.raises(error):
            await reads.fresh()
        return await reads.fresh()

    assert asyncio.run(main()) == 2
