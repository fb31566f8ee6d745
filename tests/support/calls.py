"""Queued calls as a test makes and waits for them: through the HTTP API, as a client does."""

from __future__ import annotations

import time

import httpx

from ember.wire import FINAL_STATUSES


def spawn(http: httpx.Client, fn: str, body: object, app: str = "probe", **headers: str) -> str:
    """``POST /v1/<app>/<fn>/spawn``: the call's id (asserting the 202)."""
    response = http.post(f"/v1/{app}/{fn}/spawn", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return response.json()["call_id"]


def result(http: httpx.Client, call_id: str, timeout_s: float = 60.0) -> dict:
    """The call's record once final, long-polled (``GET /v1/calls/<id>?wait=5``); an assertion after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    record: dict = {}
    while time.monotonic() < deadline:
        record = http.get(f"/v1/calls/{call_id}", params={"wait": 5}).json()
        if record["status"] in FINAL_STATUSES:
            return record
    raise AssertionError(f"call {call_id} did not finish: {record}")
