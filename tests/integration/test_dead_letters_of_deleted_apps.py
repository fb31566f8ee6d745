"""A deleted app's dead letters go with it: whoever deploys an app of that name next (another team, given a token
whose patterns match it) neither reads the old inputs nor replays them on its own code. Through the product's doors:
a push, a spawn that fails into a dead letter, ``DELETE /v1/apps/<app>``, the same push again, ``GET .../dead``."""

from __future__ import annotations

import uuid

import pytest
from support.polling import wait_for

from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''
import ember

app = ember.App("{app}")


@app.function(retries=0, min_replicas=1)
def charge(card: str) -> str:
    raise ValueError("declined")
'''


def test_a_deleted_apps_dead_letters_do_not_reach_the_next_app_of_its_name(tmp_path, transport, http):
    app = f"payments-{uuid.uuid4().hex[:8]}"
    (tmp_path / "app.py").write_text(APP.format(app=app))
    deploy(tmp_path / "app.py", transport=transport, timeout_s=180)
    spawned = http.post(f"/v1/{app}/charge/spawn", json="4111-1111-1111-1111")
    assert spawned.status_code == 202, spawned.text
    call_id = spawned.json()["call_id"]

    def letters() -> list[dict]:
        answer = http.get(f"/v1/apps/{app}/dead", params={"function": "charge"})
        return answer.json() if answer.status_code == 200 else []

    wait_for(lambda: any(d["call_id"] == call_id for d in letters()), timeout_s=60, what="the dead letter")
    assert http.delete(f"/v1/apps/{app}").status_code in (200, 202, 204)
    wait_for(lambda: http.get(f"/v1/apps/{app}").status_code == 404, timeout_s=60, what="the app gone")
    deploy(tmp_path / "app.py", transport=transport, timeout_s=180)  # the next owner of the name
    assert letters() == []
    replayed = http.post(f"/v1/apps/{app}/dead/replay", json={"function": "charge"})
    assert replayed.status_code in (200, 202) and replayed.json()["replayed"] == [], replayed.text
    http.delete(f"/v1/apps/{app}")
