"""The agent's replica records are hostile input when read back: only a process the agent started (its start time,
its mark, its replica id) is adopted or signalled; anything else is dropped and left alone."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
from support.polling import wait_for

from ember_runtime.agent import adoption
from ember_runtime.agent.adoption import MARK_ENV, Record, Records, start_time

SLEEP = "import time; time.sleep(60)"


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def _start(procs: list[subprocess.Popen[bytes]], replica_id: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", SLEEP, "--replica-id", replica_id], env={**os.environ, **env},
                            start_new_session=True)
    procs.append(proc)
    # exec(2) has begun when Popen returns; its arguments and environment show in /proc once it has completed
    wait_for(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), timeout_s=10, what="the process to start")
    return proc


def _record(replica_id: str, pid: int, nonce: str = "n" * 32, **changes: object) -> Record:
    fields: dict[str, object] = dict(replica_id=replica_id, app="a", service="f", version=1, index=0,
                                     bundle_sha256="0" * 64, pid=pid, start_time=_started(pid), nonce=nonce)
    return Record(**{**fields, **changes})  # type: ignore[arg-type]


def _started(pid: int) -> int:
    for _ in range(1000):
        if (found := start_time(pid)) is not None:
            return found
    raise AssertionError(f"process {pid} has no start time")


def test_only_the_processes_the_agent_started_are_kept(tmp_path: Path, procs) -> None:
    records = Records(tmp_path / "replicas")
    ours = _start(procs, "r-ours", {MARK_ENV: "a" * 32})
    unmarked = _start(procs, "r-unmarked", {})
    other_mark = _start(procs, "r-other", {MARK_ENV: "b" * 32})
    records.write(_record("r-ours", ours.pid, "a" * 32))
    records.write(_record("r-unmarked", unmarked.pid, "a" * 32))  # no mark in its environment
    records.write(_record("r-other", other_mark.pid, "a" * 32))  # another nonce than the record's
    reused = _start(procs, "r-reused", {MARK_ENV: "a" * 32})
    records.write(_record("r-reused", reused.pid, "a" * 32,
                          start_time=_started(reused.pid) - 1))  # its number, now another process's
    records.write(_record("r-renamed", ours.pid, "a" * 32))  # the right process, under another replica's id
    records.write(_record("r-init", 1, start_time=0))
    (records.folder("r-garbage") / adoption.RECORD).write_text("{not json")
    (records.folder("r-wrong-name") / adoption.RECORD).write_bytes(msgspec.json.encode(
        _record("r-ours", ours.pid, "a" * 32)))  # a record copied into another replica's folder
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / adoption.RECORD).write_bytes(msgspec.json.encode(_record("r-link", ours.pid, "a" * 32)))
    (records.root / "r-link").symlink_to(elsewhere)

    found, ended = records.load()
    assert set(found) == {"r-ours"}
    assert set(ended) == {"r-reused"}  # its process ended: its slot's next start is counted as a restart
    assert {p.name for p in records.root.iterdir()} == {"r-ours"}  # the others' records are removed
    assert (elsewhere / adoption.RECORD).exists()  # what a link pointed at is left alone
    assert records.root.stat().st_mode & 0o777 == 0o700
    assert all(p.poll() is None for p in procs)  # and no process was signalled


def test_a_record_of_a_process_not_ours_is_neither_stopped_nor_adopted(tmp_path: Path, procs) -> None:
    records = Records(tmp_path / "replicas")
    stranger = _start(procs, "r-1", {})
    record = _record("r-1", stranger.pid)

    async def go() -> adoption.Adopted | None:
        await records.stop(record, grace_s=1)
        return await adoption.Adopted.take(records.folder("r-1"), record)

    assert asyncio.run(go()) is None
    assert stranger.poll() is None


def test_a_replica_of_the_agent_is_stopped_through_its_record(tmp_path: Path, procs) -> None:
    records = Records(tmp_path / "replicas")
    ours = _start(procs, "r-1", {MARK_ENV: "c" * 32})
    record = _record("r-1", ours.pid, "c" * 32)
    records.write(record)
    asyncio.run(records.stop(record, grace_s=5))
    assert ours.wait(10) == -15  # SIGTERM to its group
    assert not (records.root / "r-1").exists()


@pytest.mark.parametrize("replica_id", ["../escape", "", ".hidden", "a/b", "r.1", "x" * 201])
def test_a_replica_id_that_is_not_a_plain_name_gets_no_folder(tmp_path: Path, replica_id: str) -> None:
    with pytest.raises(ValueError, match="replica id"):
        Records(tmp_path / "replicas").folder(replica_id)
    assert not (tmp_path / "escape").exists()


def test_a_replica_that_began_as_a_warm_start_is_kept_under_the_id_it_was_started_with(tmp_path: Path,
                                                                                       procs) -> None:
    records = Records(tmp_path / "replicas")
    warm = _start(procs, "warm-0123abcd", {MARK_ENV: "c" * 32})  # its command line names the warm start
    records.write(_record("r-took", warm.pid, "c" * 32, command_id="warm-0123abcd"))
    records.write(_record("r-claims", warm.pid, "c" * 32))  # the same process without the id it was started with
    records.write(_record("r-other-id", warm.pid, "c" * 32, command_id="warm-ffffffff"))
    found, _ = records.load()
    assert set(found) == {"r-took"}
