"""The token store against a bare nats-server of its own (an empty token bucket).

An installation's first admin token: a control plane started without ``--bootstrap-token-file`` prints one, once
(two starting together print one between them; a restart prints none), and that token works; a bootstrap file's
token is ensured idempotently by every control plane that is given it. The records of tokens long revoked or
expired are collected; a full bucket refuses a new token with a 503."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import nats
import pytest
from support import stacks
from support.auth import bearer
from support.polling import wait_for

from ember._errors import UnauthenticatedError, UnavailableError
from ember._procs import die_with_parent
from ember.dev.embedded import NATS_CONFIG, nats_server_binary
from ember.wire import StoredToken, TokenInfo, TokenRequest, encoder
from ember.wire.jetstream import StorageLimits, ensure_buckets
from ember.wire.tokens import new_token, parse_token
from ember_platform.auth.scopes import EVERYONE
from ember_platform.auth.tokens import FIRST_ADMIN_ID, KEEP_DEAD_S, TokenStore

pytestmark = pytest.mark.integration
_LISTENING = re.compile(r"Listening for client connections on [^:]+:(\d+)")
_PRINTED = re.compile(r"ember_admin_[A-Za-z0-9_-]+")


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    """A bare nats-server with JetStream (a fresh, empty store)."""
    conf, log = tmp_path / "nats.conf", tmp_path / "nats.log"
    conf.write_text(NATS_CONFIG)
    proc = subprocess.Popen([nats_server_binary(), "-a", "127.0.0.1", "-p", "-1", "-js", "-sd", str(tmp_path / "js"),
                             "-c", str(conf), "-l", str(log)], stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)
    try:
        port = wait_for(lambda: log.exists() and (m := _LISTENING.search(log.read_text())) and m[1], timeout_s=30,
                        what="nats-server")
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(30)


class ControlPlane:
    """One control plane process, its output kept in a file."""

    def __init__(self, tmp: Path, name: str, nats: str, *extra: str) -> None:
        self.out = tmp / f"{name}.out"
        url_file = tmp / f"{name}.url"
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "ember_platform", "--nats", nats, "--port", "0",
                                          "--url-file", str(url_file), "--insecure-no-nats-auth", *extra],
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         preexec_fn=die_with_parent)
        try:
            self.url = str(wait_for(lambda: url_file.exists() and url_file.read_text(), timeout_s=120, what=name))
        except AssertionError as exc:  # never left running (a later test would meet it as a ResourceWarning)
            self.stop(kill=True)
            raise AssertionError(f"{exc}; it printed:\n{self.out.read_text()[-3000:]}") from None

    def printed(self) -> list[str]:
        return _PRINTED.findall(self.out.read_text())

    def stop(self, *, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) it and wait for it to exit; one still running 30 s after a SIGTERM is killed, and
        the test fails with its stacks at that moment."""
        if self.proc.poll() is not None:
            return
        self.proc.kill() if kill else self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            where = stacks.dump([self.proc.pid])
            self.proc.kill()
            self.proc.wait(30)
            raise AssertionError(f"{self.out.name}: still running 30 s after SIGTERM; its stacks were:\n{where}") \
                from None


def _whoami(url: str, token: str) -> httpx.Response:
    return httpx.get(f"{url}/v1/tokens/self", headers=bearer(token), timeout=30)


@pytest.fixture
def start(tmp_path: Path, nats_url: str) -> Iterator[Callable[..., ControlPlane]]:
    """Start a named control plane on the test's nats-server; each is stopped after the test."""
    started: list[ControlPlane] = []

    def start(name: str, *extra: str) -> ControlPlane:
        started.append(ControlPlane(tmp_path, name, nats_url, *extra))
        return started[-1]

    yield start
    for plane in started:
        plane.proc.terminate()  # all at once, so that each stops as the others do
    failures = []
    for plane in started:
        try:
            plane.stop()
        except AssertionError as exc:  # the others are still stopped
            failures.append(str(exc))
    assert not failures, "\n".join(failures)


def test_the_first_start_prints_one_admin_token_once(start: Callable[..., ControlPlane]):
    first, second = start("a"), start("b")
    printed = first.printed() + second.printed()
    assert len(printed) == 1, printed  # two control planes starting together: one token between them
    token = printed[0]
    for plane in (first, second):  # the other one sees it through the bucket's watch
        wait_for(lambda plane=plane: _whoami(plane.url, token).status_code == 200, timeout_s=30, what="token")
    assert _whoami(first.url, token).json()["scopes"] == ["admin"]
    # Started without NATS credentials, on purpose: it says so in its log (a bare nats-server checks none).
    assert "INSECURE (--insecure-no-nats-auth)" in first.out.read_text()
    status = httpx.get(f"{first.url}/v1/status", headers=bearer(token), timeout=30).json()  # and ember status
    assert status["insecure"] == ["NATS admits clients without credentials (no --nats-auth-dir)"]
    first.stop()
    again = start("a2")
    assert again.printed() == []  # never again
    assert _whoami(again.url, token).status_code == 200


def test_a_bootstrap_file_is_ensured_by_every_control_plane(tmp_path: Path, start: Callable[..., ControlPlane]):
    token_file = tmp_path / "token"
    token_file.write_text(new_token() + "\n")
    token_file.chmod(0o600)
    token = token_file.read_text().strip()
    planes = [start(f"cp{i}", "--bootstrap-token-file", str(token_file)) for i in range(2)]
    assert [p.printed() for p in planes] == [[], []]
    for plane in planes:
        assert _whoami(plane.url, token).json()["name"] == "bootstrap"
        assert token not in plane.out.read_text()
    planes[0].stop()
    again = start("cp0-again", "--bootstrap-token-file", str(token_file))
    assert _whoami(again.url, token).status_code == 200  # across restarts
    listed = httpx.get(f"{again.url}/v1/tokens", headers=bearer(token), timeout=30).json()
    assert len(listed) == 1  # recorded once


def test_a_bootstrap_file_others_can_read_is_refused(tmp_path: Path):
    token_file = tmp_path / "token"
    token_file.write_text(new_token() + "\n")
    token_file.chmod(0o644)
    proc = subprocess.run([sys.executable, "-m", "ember_platform", "--bootstrap-token-file", str(token_file)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "chmod 600" in proc.stderr
    assert token_file.read_text().strip() not in proc.stderr


def _store_test(url: str, limits: StorageLimits, body):  # type: ignore[no-untyped-def]
    async def go():  # type: ignore[no-untyped-def]
        nc = await nats.connect(url)
        store = TokenStore((await ensure_buckets(nc.jetstream(), limits)).tokens)
        await store.start()
        try:
            return await body(store)
        finally:
            await store.stop()
            await nc.close()

    return asyncio.run(go())


def test_records_of_tokens_long_dead_are_collected(nats_url: str):
    now = time.time()
    old = now - KEEP_DEAD_S - 60

    def stored(token_id: str, revoked_at: float | None = None, expires_at: float | None = None) -> StoredToken:
        info = TokenInfo(id=token_id, name="", scopes=["read"], apps=["*"], created_at=old - 1, expires_at=expires_at)
        return StoredToken(info=info, secret_sha256="0" * 64, revoked_at=revoked_at)

    records = [stored("oldrevoked", revoked_at=old), stored("oldexpired", expires_at=old),
               stored("newrevoked", revoked_at=now - 60), stored("newexpired", expires_at=now - 60),
               stored("live"), stored("later", expires_at=now + 3600), stored(FIRST_ADMIN_ID, revoked_at=old)]

    async def body(store: TokenStore) -> list[str]:
        for record in records:
            await store._kv.put(record.info.id, encoder.encode(record))
        await _until(lambda: len(store.mirror.items) == len(records))
        purged = await store.collect(now)
        await _until(lambda: len(store.mirror.items) == len(records) - len(purged))
        assert sorted(store.mirror.items) == sorted(["newrevoked", "newexpired", "live", "later", FIRST_ADMIN_ID])
        assert await store.first_admin() is None  # the first admin's record stays: never printed again
        return sorted(purged)

    assert _store_test(nats_url, StorageLimits(), body) == ["oldexpired", "oldrevoked"]


def test_a_bootstrap_token_revoked_long_ago_stays_revoked_when_its_file_is_given_again(nats_url: str):
    """Its record outlives the collector: purged, the same file at the next start made it anew, a live admin."""
    token = new_token()
    token_id = parse_token(token)[0]  # type: ignore[index]

    async def body(store: TokenStore) -> None:
        await store.ensure_admin(token, "bootstrap")
        await store.revoke(token_id, EVERYONE)
        assert await store.collect(time.time() + KEEP_DEAD_S + 60) == []
        await store.ensure_admin(token, "bootstrap")  # the next start, given the same file
        with pytest.raises(UnauthenticatedError):
            store.authenticate(f"Bearer {token}")

    _store_test(nats_url, StorageLimits(), body)


def test_a_bootstrap_tokens_spoiled_record_is_written_again_from_its_file(nats_url: str):
    """A server's acknowledgement under its key (stored there through a replica's reply subject while no control plane
    ran to write the record back) stopped every control plane's start (a decode error out of ``bootstrap``): the
    record is written again, revoked (a revoked token must not come back); anything else still stops the start."""
    token = new_token()
    token_id = parse_token(token)[0]  # type: ignore[index]

    async def body(store: TokenStore) -> None:
        await store.ensure_admin(token, "bootstrap")
        await store.mirror.stop()  # no control plane runs (a running one writes the record back: test_reply_subjects)
        await store._kv.put(token_id, b'{"stream":"KV_ember_calls","seq":7}')
        await store.ensure_admin(token, "bootstrap")  # the next start, given the same file: it starts
        with pytest.raises(UnauthenticatedError):  # revoked: whether it was is lost, and a revoked one stays so
            store.authenticate(f"Bearer {token}")
        await store._kv.put(token_id, b'{"not": "a token"}')  # no server's answer: a record of another shape
        with pytest.raises(ValueError, match="belongs to another token"):
            await store.ensure_admin(token, "bootstrap")

    _store_test(nats_url, StorageLimits(), body)


def test_a_full_token_bucket_refuses_a_new_token_with_a_503(nats_url: str):
    async def body(store: TokenStore) -> int:
        created = 0
        with pytest.raises(UnavailableError) as caught:
            for _ in range(100):
                await store.create(TokenRequest(scopes=["read"], name="x" * 60), EVERYONE)
                created += 1
        assert caught.value.http_status == 503 and "EMBER_TOKENS_KV_MAX_BYTES" in caught.value.message
        return created

    assert 0 < _store_test(nats_url, StorageLimits(tokens_kv_max_bytes=4096), body) < 100


async def _until(predicate, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting for the token mirror"
        await asyncio.sleep(0.01)
