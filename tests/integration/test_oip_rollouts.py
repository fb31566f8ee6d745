"""A model's metadata during a rollout: a read without a version describes the version that takes the app's calls (a
canary's stable one), the same at every read, and lists every version that serves the model. Before, each read drew a
version by the traffic split: a client read one signature and had its inference sent to the other."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ember._client import Transport
from ember._deploy import deploy
from ember._errors import EmberError

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
APP = "oip-rolled"
SOURCE = '''from typing import Annotated

import numpy as np

import ember

app = ember.App({app!r})


@app.function()
def total(x: Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, {width}))]) -> Annotated[
        np.ndarray, ember.Tensor(dtype="float32", shape=(None,))]:
    return x.sum(axis=1)
'''


@pytest.fixture
def source(tmp_path: Path, transport: Transport) -> Iterator[Path]:
    yield tmp_path / "oip_rolled.py"
    with contextlib.suppress(EmberError):
        transport.request("DELETE", f"/v1/apps/{APP}")


def test_metadata_without_a_version_is_the_serving_versions_during_a_canary(source: Path, transport: Transport,
                                                                              http: httpx.Client) -> None:
    source.write_text(SOURCE.format(app=APP, width=4))
    first = deploy(source, transport=transport, timeout_s=120)
    source.write_text(SOURCE.format(app=APP, width=8))
    canary = deploy(source, transport=transport, timeout_s=120, canary_percent=50)
    assert canary.version == first.version + 1
    for _ in range(12):
        meta = http.get(f"/v2/models/{APP}.total").json()
        assert meta["inputs"][0]["shape"] == [-1, 4], meta  # the stable version's, at every read
        assert meta["versions"] == [str(first.version), str(canary.version)]
    pinned = http.get(f"/v2/models/{APP}.total/versions/{canary.version}").json()
    assert pinned["inputs"][0]["shape"] == [-1, 8]
