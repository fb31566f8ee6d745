"""A replica's output is read to its end, line by line, each line cut to a bound (``agent.slots.output_lines``)."""

from __future__ import annotations

import asyncio

import pytest

from ember_runtime.agent.slots import output_lines


def lines_of(*chunks: bytes, max_line: int = 10) -> list[str]:
    async def read() -> list[str]:
        stream = asyncio.StreamReader()
        for chunk in chunks:
            stream.feed_data(chunk)
        stream.feed_eof()
        return [line async for line in output_lines(stream, max_line)]

    return asyncio.run(read())


def test_lines_split_across_chunks_come_out_whole() -> None:
    assert lines_of(b"one\ntw", b"o\nthr", b"ee") == ["one", "two", "three"]
    assert lines_of(b"a\n\nb\n") == ["a", "", "b"]


def test_an_overlong_line_is_cut_and_says_how_much_was_not_kept() -> None:
    assert lines_of(b"x" * 25 + b"\nnext\n") == ["x" * 10 + " [... 15 more bytes of this line not kept]", "next"]


@pytest.mark.parametrize("chunk", [1, 7, 4096])
def test_a_line_far_over_the_pipe_buffer_does_not_stop_the_reader(chunk: int) -> None:
    # asyncio's own readline gives up at 64 KiB, after which nobody reads the pipe and the replica blocks on it.
    data = b"y" * 300_000 + b"\nafter\n"
    got = lines_of(*(data[i:i + chunk * 1000] for i in range(0, len(data), chunk * 1000)), max_line=100)
    assert got == ["y" * 100 + " [... 299900 more bytes of this line not kept]", "after"]


def test_a_last_line_without_a_newline_and_bad_utf8_are_kept() -> None:
    assert lines_of(b"ok\n\xff\xfepartial") == ["ok", "\ufffd\ufffdpartial"]
