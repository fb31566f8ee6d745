"""An output the encoder cannot write (a list that holds itself; an integer beyond msgpack's 64 bits) answers its
call with an ``InvalidOutput`` error, and the function keeps serving: the error escaped the answer, the replica's
batcher loop died with it, and that call and every later one of the function on that replica went unanswered (504s;
a spawned call held and renewed forever)."""

from __future__ import annotations

import concurrent.futures

import httpx
import msgspec
import pytest
from support.calls import result
from support.paths import REPO

from ember.wire import AppView

pytestmark = pytest.mark.integration
APP = REPO / "tests" / "apps" / "outputs" / "outputs.py"
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def outputs(deployed) -> AppView:
    return deployed(APP)


def _invalid_output(response: httpx.Response, words: str) -> None:
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert (error["code"], error["type"]) == ("user_error", "InvalidOutput"), error
    assert words in error["message"], error


def test_an_output_that_holds_itself_is_the_calls_error_and_the_next_call_runs(outputs, http):
    _invalid_output(http.post("/v1/outputs/one", json="itself"), "holds itself")
    after = http.post("/v1/outputs/one", json="fine")
    assert after.status_code == 200 and after.json() == "fine", after.text


def test_an_integer_beyond_64_bits_in_msgpack_is_the_calls_error_and_the_next_call_runs(outputs, http):
    assert http.post("/v1/outputs/one", json="huge").json() == 2**70  # JSON writes it
    _invalid_output(http.post("/v1/outputs/one", json="huge", headers={"Accept": MSGPACK}), "in msgpack")
    after = http.post("/v1/outputs/one", json="fine", headers={"Accept": MSGPACK})
    assert after.status_code == 200 and msgspec.msgpack.decode(after.content) == "fine"


def test_a_batch_with_an_unencodable_output_answers_the_others(outputs, http):
    kinds = ["itself", "a", "b", "huge", "c"]
    with concurrent.futures.ThreadPoolExecutor(len(kinds)) as pool:
        answers = list(pool.map(lambda kind: http.post("/v1/outputs/many", json=kind), kinds))
    _invalid_output(answers[0], "holds itself")
    assert [a.json() for a in answers[1:]] == ["a", "b", 2**70, "c"]
    after = http.post("/v1/outputs/many", json="d")
    assert after.status_code == 200 and after.json() == "d", after.text


def test_a_spawned_call_with_an_unencodable_output_fails_and_the_queue_keeps_flowing(outputs, http):
    bad = http.post("/v1/outputs/one/spawn", json="itself").json()["call_id"]
    fine = http.post("/v1/outputs/one/spawn", json="fine").json()["call_id"]
    records = {call_id: result(http, call_id) for call_id in (bad, fine)}
    assert records[bad]["status"] == "failed" and records[bad]["attempts"] == 1, records[bad]
    assert records[bad]["error"]["type"] == "InvalidOutput" and "holds itself" in records[bad]["error"]["message"]
    assert records[fine]["status"] == "succeeded" and records[fine]["output"] == "fine"
