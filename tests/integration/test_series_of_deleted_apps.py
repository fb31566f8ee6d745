"""A deleted app's language-model and schedule figures leave ``/metrics`` with it: an app that comes and goes (or a
model renamed at each push) does not grow the control plane's series for ever. Through the product's doors: a push,
OpenAI's route, a schedule's run-now, ``DELETE /v1/apps/<app>``, ``GET /metrics``."""

from __future__ import annotations

import uuid

import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.polling import wait_for

from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

APP = '''
from collections.abc import Iterator
import ember

app = ember.App("{app}")


@app.function(openai="{model}", min_replicas=1)
def talk(req: ember.openai.ChatRequest) -> Iterator[str]:
    yield "hi"


@app.function(schedule=ember.Period(seconds=1), min_replicas=1)
def chore() -> None:
    pass
'''


def _series(http, app: str) -> set[str]:
    """The LLM and schedule families that have a series of ``app`` on ``/metrics``."""
    found = set()
    for family in text_string_to_metric_families(http.get("/metrics").text):
        if family.name.startswith(("vllm:", "ember_schedule_")):
            found |= {family.name for sample in family.samples if sample.labels.get("app") == app}
    return found


def test_a_deleted_apps_model_and_schedule_series_go_with_it(tmp_path, transport, http):
    app, model = f"gone-{uuid.uuid4().hex[:8]}", f"model-{uuid.uuid4().hex[:8]}"
    (tmp_path / "app.py").write_text(APP.format(app=app, model=model))
    deploy(tmp_path / "app.py", transport=transport, timeout_s=180)
    answered = http.post("/openai/v1/chat/completions", json={"model": model,
                                                              "messages": [{"role": "user", "content": "x"}]})
    assert answered.status_code == 200, answered.text
    run = http.post(f"/v1/apps/{app}/schedules/chore/run")
    assert run.status_code == 202, run.text
    assert http.get(f"/v1/calls/{run.json()['call_id']}", params={"wait": 60}).json()["status"] == "succeeded"
    wait_for(lambda: {"vllm:time_to_first_token_seconds", "vllm:generation_tokens", "ember_schedule_runs",
                      "ember_schedule_lag_seconds"} <= _series(http, app), timeout_s=30, what="the app's series",
             explain=lambda: str(_series(http, app)))
    assert http.delete(f"/v1/apps/{app}").status_code in (200, 202, 204)
    wait_for(lambda: not _series(http, app), timeout_s=30, what="the deleted app's series to go")
