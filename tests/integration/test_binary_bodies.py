"""Binary and compact bodies on a function's own routes, against the real platform: raw bytes in and out
(``application/octet-stream``), msgpack in and out, numpy arrays as JSON nested lists, the SDK's bytes, and each
function's body limit (413 naming it; a push asking for more than the platform's cap is a 422).

The app: tests/apps/arrays.
"""

from __future__ import annotations

import hashlib
import os

import msgspec
import numpy as np
import pytest
from support.paths import REPO

import ember
from ember._client import RawBody, invoke_op

pytestmark = pytest.mark.integration

ARRAYS = REPO / "tests" / "apps" / "arrays" / "arrays.py"
OCTET = {"Content-Type": "application/octet-stream"}
MSGPACK = "application/msgpack"


@pytest.fixture(scope="module")
def arrays(deployed):
    return deployed(ARRAYS, "arrays")  # pushed as `ember push` does: numpy imported as written


def test_a_raw_3_mb_image_round_trips_byte_exact(arrays, http):
    image = os.urandom(3 * 1024 * 1024)
    response = http.post("/v1/arrays/echo", content=image, headers=OCTET)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == "application/octet-stream"
    assert response.content == image
    digest = http.post("/v1/arrays/digest", content=image, headers=OCTET)
    assert digest.json() == hashlib.sha256(image).hexdigest()


def test_a_bytes_result_is_json_unless_raw_is_accepted(arrays, http):
    as_json = http.post("/v1/arrays/echo", json=msgspec.json.decode(msgspec.json.encode(b"\x00\xffhi")))
    assert as_json.headers["content-type"] == "application/json"
    assert msgspec.json.decode(as_json.content, type=bytes) == b"\x00\xffhi"  # base64, as JSON carries bytes
    raw = http.post("/v1/arrays/echo", json=msgspec.json.decode(msgspec.json.encode(b"\x00\xffhi")),
                    headers={"Accept": "application/octet-stream"})
    assert (raw.headers["content-type"], raw.content) == ("application/octet-stream", b"\x00\xffhi")
    asked_json = http.post("/v1/arrays/echo", content=b"\x01\x02", headers={**OCTET, "Accept": "application/json"})
    assert msgspec.json.decode(asked_json.content, type=bytes) == b"\x01\x02"


def test_the_sdk_sends_and_receives_bytes_raw(arrays, ember_url):
    blob = os.urandom(200_000)
    assert ember.lookup("arrays", "echo").remote(blob) == blob
    assert ember.lookup("arrays", "digest").remote(blob) == hashlib.sha256(blob).hexdigest()
    assert invoke_op("arrays", "echo", RawBody(b"x")).headers["content-type"] == "application/octet-stream"


def test_msgpack_in_and_out(arrays, http):
    picture = msgspec.msgpack.encode({"name": "cat", "data": b"\x89PNG\r\n" + os.urandom(1000)})
    packed = http.post("/v1/arrays/describe", content=picture,
                       headers={"Content-Type": MSGPACK, "Accept": MSGPACK})
    assert packed.status_code == 200, packed.text
    assert packed.headers["content-type"] == MSGPACK
    assert msgspec.msgpack.decode(packed.content) == {"name": "cat", "size": 1006, "head": b"\x89PNG"}
    as_json = http.post("/v1/arrays/describe", content=picture, headers={"Content-Type": MSGPACK})
    assert as_json.json()["head"] == "iVBORw==", as_json.text  # the same bytes, base64 in JSON
    from_json = http.post("/v1/arrays/describe", json={"name": "dog", "data": "AAEC"}, headers={"Accept": MSGPACK})
    assert msgspec.msgpack.decode(from_json.content) == {"name": "dog", "size": 3, "head": b"\x00\x01\x02"}


def test_bad_msgpack_and_bad_media_types_are_client_errors(arrays, http):
    malformed = http.post("/v1/arrays/describe", content=b"\xc1\xc1", headers={"Content-Type": MSGPACK})
    assert malformed.status_code == 400, malformed.text
    assert "msgpack" in malformed.json()["error"]["message"]
    wrong = http.post("/v1/arrays/describe", content=msgspec.msgpack.encode({"name": 3, "data": b""}),
                      headers={"Content-Type": MSGPACK})
    assert (wrong.status_code, wrong.json()["error"]["field"]) == (422, "$.name")
    raw_to_struct = http.post("/v1/arrays/describe", content=b"abc", headers=OCTET)
    assert raw_to_struct.status_code == 415, raw_to_struct.text
    assert raw_to_struct.json()["error"]["field"] == "Content-Type"


def test_each_function_has_its_body_limit(arrays, http):
    assert http.post("/v1/arrays/small", content=b"x" * 65536, headers=OCTET).json() == 65536
    over = http.post("/v1/arrays/small", content=b"x" * 65537, headers=OCTET)
    assert over.status_code == 413
    message = over.json()["error"]["message"]
    assert "max_body_bytes" in message and "65536" in message, message
    default = http.post("/v1/arrays/echo", content=b"x" * (4 * 1024 * 1024 + 1), headers=OCTET)
    assert default.status_code == 413
    assert "EMBER_MAX_BODY_BYTES" in default.json()["error"]["message"]


def test_a_push_asking_for_more_than_the_cap_is_refused(http):
    app = ember.App("too-big")

    @app.function(max_body_bytes=512 * 1024 * 1024)
    def take(data: bytes) -> int:
        return len(data)

    manifest = app.manifest("too_big")
    response = http.post("/v1/apps/too-big/deployments",
                         content=msgspec.json.encode({"bundle_sha256": "ab" * 32, "manifest": manifest}))
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "$.manifest.services[0].functions[0].max_body_bytes"
    assert "EMBER_MAX_BODY_CAP_BYTES" in response.json()["error"]["message"]


def test_numpy_arrays_travel_as_nested_lists_on_embers_own_routes(arrays, http, ember_url):
    answer = http.post("/v1/arrays/scale", json={"x": [[1, 2, 3, 4], [0, 0, 0, 1]], "factor": [2]})
    assert answer.json() == [[2, 4, 6, 8], [0, 0, 0, 2]], answer.text
    bad_shape = http.post("/v1/arrays/scale", json={"x": [[1, 2, 3]], "factor": [2]})
    assert (bad_shape.status_code, bad_shape.json()["error"]["field"]) == (422, "$.x[0]")  # a row of 3, not 4
    not_numbers = http.post("/v1/arrays/norms", json=[["a", "b", "c", "d"]])
    assert not_numbers.status_code == 422, not_numbers.text
    packed = http.post("/v1/arrays/norms", content=msgspec.msgpack.encode([[3, 4, 0, 0]]),
                       headers={"Content-Type": MSGPACK, "Accept": MSGPACK})
    assert msgspec.msgpack.decode(packed.content) == [5.0]
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    assert ember.lookup("arrays", "scale").remote(x=x, factor=np.array([0.5], dtype=np.float32)) == \
        (x * 0.5).tolist()


def test_a_queued_call_takes_a_raw_or_msgpack_body(arrays, http):
    spawned = http.post("/v1/arrays/digest/spawn", content=b"queued bytes", headers=OCTET)
    assert spawned.status_code == 202, spawned.text
    record = http.get(f"/v1/calls/{spawned.json()['call_id']}", params={"wait": 30}).json()
    assert (record["status"], record["output"]) == ("succeeded", hashlib.sha256(b"queued bytes").hexdigest())
    packed = http.post("/v1/arrays/describe/spawn", content=msgspec.msgpack.encode({"name": "q", "data": b"\x01"}),
                       headers={"Content-Type": MSGPACK})
    record = http.get(f"/v1/calls/{packed.json()['call_id']}", params={"wait": 30}).json()
    assert record["output"] == {"name": "q", "size": 1, "head": "AQ=="}
    refused = http.post("/v1/arrays/describe/spawn", content=b"\x01", headers=OCTET)
    assert refused.status_code == 415
