"""Streams of a Continuous model on several replicas, through two gateways: a new stream goes to the replica with
the fewest running sequences, as the replicas report them (a gateway knows the other gateways' streams only from
those reports); and the autoscaler counts running sequences against ``max_seqs``."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.auth import authed_client, bearer
from support.paths import REPO
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = REPO / "tests" / "apps" / "llm" / "pair.py"


class Held:
    """A streamed completion held open (its client reads no further than its first piece); ``replica``: the one
    that runs it, named by that piece."""

    def __init__(self, url: str, token: str, model: str) -> None:
        self._client = httpx.Client(base_url=url, headers=bearer(token), timeout=60)
        self._stream = self._client.stream("POST", "/openai/v1/completions", json={
            "model": model, "prompt": "go", "max_tokens": 20000, "stream": True})
        response = self._stream.__enter__()
        assert response.status_code == 200, response.read()
        self._lines = response.iter_lines()  # kept: a reader collected as garbage closes its stream
        first = next(line for line in self._lines if line.startswith("data: "))
        self.replica: str = json.loads(first[len("data: "):])["choices"][0]["text"].strip()

    def close(self) -> None:
        self._stream.__exit__(None, None, None)
        self._client.close()


def running(http: httpx.Client, url: str, function: str) -> dict[str, int]:
    """``ember_replica_running_sequences`` of each replica of ``function`` (of app llm-pair), from ``/metrics``."""
    text = http.get(f"{url}/metrics").text
    return {s.labels["replica"]: int(s.value) for family in text_string_to_metric_families(text)
            if family.name == "ember_replica_running_sequences" for s in family.samples
            if s.labels["app"] == "llm-pair" and s.labels["function"] == function}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TestPlatform, str]]:
    """A platform with two control planes (two gateways) serving tests/apps/llm/pair.py."""
    with TestPlatform(tmp_path_factory.mktemp("routing")) as platform:
        second = platform.add_control_plane("platform-b")
        transport = Transport(platform.url, token=platform.token)
        deploy(APP, transport=transport, timeout_s=180)
        transport.close()
        yield platform, second


@pytest.fixture
def held() -> Iterator[list[Held]]:
    streams: list[Held] = []
    yield streams
    for stream in streams:
        with contextlib.suppress(Exception):
            stream.close()


def test_a_new_stream_goes_to_the_replica_with_fewer_running_sequences(cluster, held):
    platform, second = cluster
    with authed_client(platform, base_url="") as http:
        first = [Held(platform.url, platform.token, "pair") for _ in range(4)]
        held.extend(first)
        on = Counter(s.replica for s in first)
        assert len(on) == 2 and set(on.values()) == {2}, on  # this gateway's own streams: spread
        emptied = first[0].replica
        busy = next(r for r in on if r != emptied)
        for stream in [s for s in first if s.replica == emptied]:
            stream.close()
        # The replicas report it (their status, and the load reports the gateways route by).
        wait_for(lambda: running(http, second, "Pair.step") == {emptied: 0, busy: 2}, timeout_s=30,
                 what="the replicas to report 0 and 2 running sequences")
        # The other gateway has no stream open: it knows the two only from the replicas' reports.
        later = []
        for _ in range(2):
            later.append(Held(second, platform.token, "pair"))
            held.append(later[-1])
        assert [s.replica for s in later] == [emptied, emptied]
        wait_for(lambda: running(http, second, "Pair.step") == {emptied: 2, busy: 2}, timeout_s=30,
                 what="the replicas to report 2 running sequences each")
        # Their loads have held still for a while (their reports unchanged): both still count, and share. Back to
        # back: the second stream is routed before any report counts the first, which the gateway adds itself
        # (``choice.Unreported``).
        last = [Held(second, platform.token, "pair") for _ in range(2)]
        held.extend(last)
        assert sorted(s.replica for s in last) == sorted([emptied, busy])


def test_running_sequences_scale_a_model_out(cluster, held):
    platform, second = cluster
    with authed_client(platform, base_url="") as http:
        def replicas() -> list[str]:
            view = http.get(f"{platform.url}/v1/apps/llm-pair").json()
            grow = next(s for s in view["services"] if s["name"] == "Grow")
            return [r["replica_id"] for r in grow["replicas"] if r["state"] == "ready"]

        assert len(replicas()) == 1
        held.extend(Held(platform.url, platform.token, "grow") for _ in range(4))  # max_seqs=4: full
        assert len({s.replica for s in held}) == 1
        full = held[0].replica
        wait_for(lambda: len(replicas()) == 2, timeout_s=120, what="a second replica of Grow")
        new = next(r for r in replicas() if r != full)
        wait_for(lambda: running(http, platform.url, "Grow.step").get(new) == 0, timeout_s=30,
                 what="the new replica to report")
        extra = Held(second, platform.token, "grow")
        held.append(extra)
        assert extra.replica == new
