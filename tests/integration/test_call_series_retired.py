"""The call path's series (``ember_requests_total`` and its latency histogram) of a version end with it: once a
second push has taken the traffic, ``GET /metrics`` has none of the first version's and the second's count on; once
the app is deleted, none of the app's. ``GET /v1/stats`` still counts the first version's calls while the function
runs (a function's calls never go down there)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = "series-retired"
SOURCE = '''import ember
app = ember.App("{app}")


@app.function(min_replicas=1, max_replicas=1)
def f(x: int) -> str:
    return "{label}"
'''
CALL_FAMILIES = ("ember_requests_total", "ember_request_duration_seconds_bucket",
                 "ember_request_duration_seconds_count")


def push(folder: Path, label: str, transport: Transport) -> None:
    path = folder / "series_retired.py"
    path.write_text(SOURCE.format(app=APP, label=label))
    deploy(path, transport=transport, timeout_s=120)


def ours(http: httpx.Client) -> list[Sample]:
    """The app's samples of the call path's families in ``GET /metrics``."""
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples
            if s.name in CALL_FAMILIES and s.labels.get("app") == APP]


def count(samples: list[Sample], version: str, code: str = "200") -> float:
    return sum(s.value for s in samples
               if s.name == "ember_requests_total" and s.labels["version"] == version and s.labels["code"] == code)


def stats_calls(http: httpx.Client) -> int:
    functions = http.get("/v1/stats").json()["functions"]
    return next((f["calls"] for f in functions if f["app"] == APP and f["function"] == "f"), 0)


def test_a_versions_series_end_with_it_and_the_apps_with_its_deletion(transport: Transport, http: httpx.Client,
                                                                       tmp_path: Path) -> None:
    try:
        push(tmp_path, "one", transport)
        assert [http.post(f"/v1/{APP}/f", json=n).json() for n in range(3)] == ["one"] * 3
        assert http.post(f"/v1/{APP}/f", json="three").status_code == 422
        first = ours(http)
        assert count(first, "1") == 3 and count(first, "1", "422") == 1
        wait_for(lambda: stats_calls(http) == 4, timeout_s=10, what="the first version's calls in /v1/stats")

        push(tmp_path, "two", transport)  # returns once v2 takes the traffic: v1 runs no longer
        assert [http.post(f"/v1/{APP}/f", json=n).json() for n in range(2)] == ["two"] * 2
        second = ours(http)
        assert {s.labels["version"] for s in second} == {"2"}, sorted({s.labels["version"] for s in second})
        assert count(second, "2") == 2
        assert http.post(f"/v1/{APP}/f", json=9).json() == "two"
        assert count(ours(http), "2") == 3  # a running version's counters go on
        wait_for(lambda: stats_calls(http) == 7, timeout_s=10, what="both versions' calls in /v1/stats")
    finally:
        deleted = http.delete(f"/v1/apps/{APP}").status_code
    assert deleted == 204
    assert ours(http) == []
