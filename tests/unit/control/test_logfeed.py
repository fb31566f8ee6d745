"""The followers of the logs: each gets what its filter wants, a slow one loses its oldest lines and is told how
many, and a control plane serves a bounded number of them."""

from __future__ import annotations

import asyncio

import pytest

from ember.wire import LogLine
from ember_platform.control.logfeed import LogFeed, LogFilter, TooManyFollowersError


def line(text: str, replica: str = "app-svc-1", stream: str = "stdout", ts: float = 100.0) -> LogLine:
    return LogLine(replica_id=replica, stream=stream, line=text, ts=ts)  # type: ignore[arg-type]


@pytest.mark.parametrize(("flt", "wanted"), [
    (LogFilter(app="app"), True),
    (LogFilter(app="other"), False),
    (LogFilter(app="app", service="svc"), True),
    (LogFilter(app="app", service="else"), False),
    (LogFilter(app="app", replica="app-svc-1"), True),
    (LogFilter(app="app", replica="app-svc-2"), False),
    (LogFilter(app="app", stream="stderr"), False),
    (LogFilter(app="app", since=100.0), False),  # since is exclusive
    (LogFilter(app="app", since=99.0, until=100.0), True),  # until inclusive
    (LogFilter(app="app", until=99.9), False),
])
def test_a_filter_wants_what_it_names(flt: LogFilter, wanted: bool) -> None:
    assert flt.matches("app", "svc", line("x")) is wanted


def test_each_follower_gets_the_lines_its_filter_wants() -> None:
    async def main() -> None:
        feed = LogFeed()
        mine = feed.open(LogFilter(app="app", service="svc"))
        theirs = feed.open(LogFilter(app="other"))
        feed.publish("app", "svc", line("one"))
        feed.publish("app", "svc2", line("two"))
        got, dropped = await mine.next_lines(1.0)
        assert [g.line for g in got] == ["one"] and dropped == 0
        assert await theirs.next_lines(0.01) == ([], 0)
        feed.close(mine)
        feed.publish("app", "svc", line("three"))
        assert not mine.lines and len(feed) == 1

    asyncio.run(main())


def test_a_follower_that_falls_behind_loses_its_oldest_lines_and_is_told() -> None:
    async def main() -> None:
        feed = LogFeed(buffer=3)
        follower = feed.open(LogFilter(app="app"))
        for n in range(5):
            feed.publish("app", "svc", line(str(n)))
        got, dropped = await follower.next_lines(1.0)
        assert [g.line for g in got] == ["2", "3", "4"] and dropped == 2
        assert await follower.next_lines(0.01) == ([], 0)

    asyncio.run(main())


def test_a_waiting_follower_wakes_when_a_line_comes() -> None:
    async def main() -> None:
        feed = LogFeed()
        follower = feed.open(LogFilter(app="app"))
        waiter = asyncio.create_task(follower.next_lines(30.0))
        await asyncio.sleep(0.01)
        feed.publish("app", "svc", line("now"))
        got, _ = await asyncio.wait_for(waiter, 5)
        assert [g.line for g in got] == ["now"]

    asyncio.run(main())


def test_a_control_plane_serves_a_bounded_number_of_followers() -> None:
    async def main() -> None:
        feed = LogFeed(max_followers=2)
        first = feed.open(LogFilter(app="a"))
        feed.open(LogFilter(app="a"))
        with pytest.raises(TooManyFollowersError):
            feed.open(LogFilter(app="a"))
        feed.close(first)
        feed.open(LogFilter(app="a"))

    asyncio.run(main())


def test_one_token_follows_a_bounded_share_of_them() -> None:
    """One token's followers left no room for another's (every follower of the control plane was one read token's)."""
    async def main() -> None:
        feed = LogFeed(max_followers=4, max_each=2)
        mine = [feed.open(LogFilter(app="a"), "alpha"), feed.open(LogFilter(app="a"), "alpha")]
        with pytest.raises(TooManyFollowersError, match="this token"):
            feed.open(LogFilter(app="a"), "alpha")
        feed.open(LogFilter(app="b"), "beta")  # another token still follows
        feed.close(mine[0])
        feed.open(LogFilter(app="a"), "alpha")

    asyncio.run(main())
