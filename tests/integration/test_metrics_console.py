"""Metrics and the web console against a real platform: a node agent with a declared GPU, an app on it, known
traffic, and what /metrics, /v1/stats, the Grafana dashboard and the console (in headless Chromium) make of it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from support.auth import authed_client, bearer
from support.browser import console_page
from support.paths import REPO
from support.platform import TestPlatform
from support.polling import wait_for

from ember._client import Transport
from ember._deploy import deploy

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = '''import json
import os
from pathlib import Path

import ember
app = ember.App("watched")

@app.function(gpu=1, min_replicas=1, max_replicas=1)
def double(x: int) -> int:
    if x < 0:
        raise ValueError("no negative numbers")
    if x == 2000:  # "allocate" 1.5 GB on its (declared) GPU, as the node's virtual driver allows
        table = Path(os.environ["EMBER_VIRTUAL_GPU_PROCESSES"])
        device = os.environ["CUDA_VISIBLE_DEVICES"].split(",")[0]
        (table / f".{os.getpid()}").write_text(json.dumps({device: 1536}))
        (table / f".{os.getpid()}").replace(table / str(os.getpid()))
    if x == 1000:
        print("<img src=x onerror=window.pwned=1>", flush=True)  # markup in a log line: shown as text
    return 2 * x


@app.function()
def fragile(x: int) -> int:  # no retries: a spawned call goes to the dead letters at once
    raise RuntimeError(f"fragile({x}) broke")
'''
INVENTORY = ('[host]\nname = "g"\n[[gpu]]\nmodel = "A10G-24GB"\ncount = 1\nmemory_used_gb = 2\n'
             'utilization = 0.3\n')
GIB = 1 << 30
DASHBOARD = REPO / "deploy" / "grafana" / "ember.json"


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestPlatform]:
    tmp = tmp_path_factory.mktemp("watched")
    (tmp / "g.toml").write_text(INVENTORY)
    (tmp / "app").mkdir()
    (tmp / "app" / "watched.py").write_text(APP)
    with TestPlatform(tmp / "state") as running:
        # Not sandboxed: a replica declares its GPU memory to the virtual driver by its pid, which a sandbox's pid
        # namespace would hide from the agent (NVML sees host pids).
        running.add_agent("node-g", tmp / "g.toml", sandbox=False)
        transport = Transport(running.url, token=running.token)
        try:
            deploy(tmp / "app" / "watched.py", transport=transport, timeout_s=180)
        finally:
            transport.close()
        yield running


@pytest.fixture(scope="module")
def http(platform: TestPlatform) -> Iterator[httpx.Client]:
    with authed_client(platform) as client:
        yield client


def scrape(http: httpx.Client) -> list[Sample]:
    response = http.get("/metrics")
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return [s for family in text_string_to_metric_families(response.text) for s in family.samples]


def total(samples: list[Sample], name: str, **labels: str) -> float:
    return sum(s.value for s in samples if s.name == name and labels.items() <= s.labels.items())


def test_metrics_count_the_calls_made(http: httpx.Client) -> None:
    before = scrape(http)
    answers = [http.post("/v1/watched/double", json=n).status_code for n in range(7)]
    answers += [http.post("/v1/watched/double", json="seven").status_code for _ in range(2)]  # not an int
    answers.append(http.post("/v1/watched/double", json=-1).status_code)  # runs, and fails in user code
    answers.append(http.post("/v1/watched/triple", json=1).status_code)  # no such function
    answers.append(http.post("/v1/watched/double/spawn", json=3).status_code)  # queued: answered with 202
    assert answers == [200] * 7 + [422, 422, 500, 404, 202]
    after = scrape(http)

    def delta(name: str, **labels: str) -> float:
        return total(after, name, **labels) - total(before, name, **labels)

    fn = {"app": "watched", "function": "double", "version": "1"}
    assert delta("ember_requests_total", **fn, code="200") == 7
    assert delta("ember_requests_total", **fn, code="422") == 2
    assert delta("ember_requests_total", **fn, code="500") == 1
    assert delta("ember_requests_total", app="", function="", code="404") == 1  # counted, but under no name
    assert delta("ember_requests_total", **fn, code="202") == 1
    assert delta("ember_request_duration_seconds_count", **fn) == 11
    assert delta("ember_request_duration_seconds_bucket", **fn, le="+Inf") == 11
    assert 0 < delta("ember_request_duration_seconds_sum", **fn) < 60

    # The replica's own counters arrive with its next report: the 9 calls that ran (7 answered, 1 failed, 1 queued).
    ran = {"app": "watched", "function": "double"}
    wait_for(lambda: total(scrape(http), "ember_calls_total", **ran) >= 9, 30, "the replica's counters")
    now = scrape(http)
    assert total(now, "ember_calls_failed_total", **ran) >= 1
    assert total(now, "ember_queue_wait_seconds_count", **ran) >= 9
    assert total(now, "ember_batch_run_seconds_count", **ran) >= 1


def test_replicas_autoscaler_and_start_phases(http: httpx.Client) -> None:
    samples = scrape(http)
    assert total(samples, "ember_replicas", app="watched", service="double", state="ready") == 1
    assert total(samples, "ember_replicas", app="watched", service="double", state="crashed") == 0
    assert total(samples, "ember_autoscaler_desired_replicas", app="watched", service="double") == 1
    assert total(samples, "ember_autoscaler_ready_replicas", app="watched", service="double") == 1
    assert total(samples, "ember_replica_start_seconds", app="watched", service="double", phase="ready") > 0
    assert any(s.name == "ember_requests_in_flight" or s.name == "ember_queued_calls" for s in samples)


def test_the_declared_gpu_under_dcgm_and_triton_names(http: httpx.Client) -> None:
    samples = scrape(http)
    (util,) = [s for s in samples if s.name == "DCGM_FI_DEV_GPU_UTIL" and s.labels["node"] == "node-g"]
    assert util.value == 30.0 and util.labels["modelName"] == "A10G-24GB" and util.labels["UUID"]
    gpu = {"gpu_uuid": util.labels["UUID"]}
    assert total(samples, "DCGM_FI_DEV_FB_USED", UUID=gpu["gpu_uuid"]) == 2048
    assert total(samples, "DCGM_FI_DEV_FB_FREE", UUID=gpu["gpu_uuid"]) == 22 * 1024
    assert total(samples, "nv_gpu_utilization", **gpu) == 0.3
    assert total(samples, "nv_gpu_memory_total_bytes", **gpu) == 24 * GIB
    assert total(samples, "nv_gpu_memory_used_bytes", **gpu) == 2 * GIB
    assert total(samples, "ember_gpu_memory_reserved_bytes", **gpu) == 24 * GIB  # gpu=1 takes it whole

    assert http.post("/v1/watched/double", json=2000).status_code == 200
    replica = {"app": "watched", "service": "double", "node": "node-g", **gpu}
    used = wait_for(lambda: total(scrape(http), "ember_replica_gpu_memory_used_bytes", **replica), 30,
                    "the replica's GPU memory in the node's report")
    assert used == 1536 << 20


def test_a_token_for_other_apps_sees_none_of_its_series(platform: TestPlatform, http: httpx.Client) -> None:
    reply = http.post("/v1/tokens", json={"name": "others", "scopes": ["read"], "apps": ["someone-else"]})
    assert reply.status_code == 201, reply.text
    with httpx.Client(base_url=platform.url, headers=bearer(reply.json()["token"]), timeout=30) as other:
        text = other.get("/metrics").text
        assert 'app="watched"' not in text and "DCGM_FI_DEV_GPU_UTIL{" in text  # GPUs: shown, as status shows
        assert other.get("/v1/stats").json()["functions"] == []
    assert "watched" in {f["app"] for f in http.get("/v1/stats").json()["functions"]}


def test_every_metric_of_the_grafana_dashboard_is_in_a_real_scrape(http: httpx.Client) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in _panels(dashboard) for t in panel.get("targets", [])]
    assert len(exprs) >= 10
    names = {n for e in exprs for n in re.findall(r"\b((?:ember|nv|DCGM)_[A-Za-z0-9_]+)\b", e)}
    text = http.get("/metrics").text
    families = list(text_string_to_metric_families(text))
    scraped = {f.name for f in families} | {s.name for f in families for s in f.samples}  # a family may be empty
    assert names and names <= scraped, names - scraped
    templated = {v["name"] for v in dashboard["templating"]["list"]}
    assert {"app", "function"} <= templated


def dead_letters(http: httpx.Client) -> set[str]:
    return {d["call_id"] for d in http.get("/v1/apps/watched/dead").json()}


def _panels(dashboard: dict) -> Iterator[dict]:  # type: ignore[type-arg]
    for panel in dashboard["panels"]:
        yield panel
        yield from panel.get("panels", [])


# --- the console ----------------------------------------------------------------------------------------------


def test_the_console_is_served_safely(platform: TestPlatform, http: httpx.Client) -> None:
    with httpx.Client(base_url=platform.url, timeout=30) as anon:
        page = anon.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"] == "text/html; charset=utf-8"
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe-inline" not in csp
        assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "DENY"
        assert anon.get("/ui/console.js").headers["content-type"] == "text/javascript; charset=utf-8"
        assert anon.get("/ui/console.css").headers["content-type"] == "text/css; charset=utf-8"
        for path in ("/ui/..%2f..%2fetc%2fpasswd", "/ui/%2e%2e", "/ui/..%2fmetrics", "/ui/console.js%00.html",
                     "/ui/.%2fconsole.js", "/ui/missing.js", "/ui/routes.py", "/ui/__init__.py"):
            answer = anon.get(path)
            assert answer.status_code == 404, (path, answer.status_code)
            assert "root:" not in answer.text and "ember_" not in answer.text
        # A token in a query string is refused, not used (and not echoed).
        refused = anon.get("/ui", params={"token": platform.token})
        assert refused.status_code == 400 and platform.token not in refused.text
        for path in ("/v1/stats", "/v1/status", "/v1/apps", "/metrics", "/v1/apps/watched/logs"):
            assert anon.get(path).status_code == 401, path
            assert anon.get(path, params={"token": platform.token}).status_code == 401, path
            assert anon.get(path, params={"access_token": platform.token}).status_code == 401, path
    assert http.get("/v1/stats").status_code == 200


def test_ember_ui_opens_the_console_signed_in(platform: TestPlatform, http: httpx.Client, tmp_path: Path) -> None:
    opened = tmp_path / "opened-url"
    browser_cmd = tmp_path / "browser.sh"
    browser_cmd.write_text(f'#!/bin/sh\nprintf %s "$1" > {opened}\n')
    browser_cmd.chmod(0o700)
    env = {**os.environ, "EMBER_URL": platform.url, "EMBER_TOKEN": platform.token, "BROWSER": str(browser_cmd),
           "XDG_CONFIG_HOME": str(tmp_path / "config")}
    cli = subprocess.run([sys.executable, "-m", "ember.cli", "ui"], capture_output=True, text=True, env=env,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert platform.token not in cli.stdout + cli.stderr
    url = wait_for(lambda: opened.exists() and opened.read_text(), 10, "ember ui to start the browser")
    assert url.startswith("file://") and platform.token not in url  # never on the browser's command line
    assert f'url={platform.url}/ui#token=' in (tmp_path / "config" / "ember" / "console.html").read_text()

    assert http.post("/v1/watched/double", json=1000).status_code == 200
    wait_for(lambda: any("onerror" in line["line"] for line in http.get("/v1/apps/watched/logs").json()), 30,
             "the log line with markup")
    dead_id = http.post("/v1/watched/fragile/spawn", json=7).json()["call_id"]
    assert http.get(f"/v1/calls/{dead_id}", params={"wait": 60}).json()["status"] == "failed"
    wait_for(lambda: dead_id in dead_letters(http), 30, "the dead letter")
    stop = threading.Event()

    def traffic() -> None:
        with authed_client(platform) as client:
            n = 0
            while not stop.is_set():
                client.post("/v1/watched/double", json=n)
                n += 1
                stop.wait(0.05)

    sender = threading.Thread(target=traffic)
    sender.start()
    try:
        with console_page() as (page, problems):
            page.goto(url)  # the page ember ui wrote sends the browser on to the console, signed in
            page.wait_for_selector('#apps tr[data-app="watched"]', timeout=30_000)
            assert "token" not in page.url  # taken off the address bar at once
            assert page.evaluate("sessionStorage.getItem('ember.token')") == platform.token
            chip = page.wait_for_selector('[data-node="node-g"] .device [data-replica]', timeout=30_000)
            assert chip is not None and "watched.double" in chip.inner_text()
            assert page.locator('[data-node="node-g"] svg.bar rect.used').count() == 1
            card = '[data-function="watched.double"]'
            page.wait_for_function(
                f"""() => {{
                    const rate = document.querySelector('{card} .rate');
                    const line = document.querySelector('{card} svg.rate-chart polyline[data-series=rate]');
                    if (!rate || !(parseFloat(rate.textContent) > 0) || !line) return false;
                    const xy = line.getAttribute('points').split(' ').map((p) => p.split(',').map(Number));
                    const xs = new Set(xy.map(([x]) => x));
                    return xs.size >= 2 && xy.some(([, y]) => y < 76);  // a width, and above the zero line
                }}""", timeout=30_000)
            page.wait_for_selector("#starts svg.bar rect", timeout=10_000)  # cold-start phases
            page.wait_for_function("() => document.getElementById('logs').textContent.includes('onerror')",
                                   timeout=10_000)
            assert page.locator("#logs img").count() == 0 and page.evaluate("window.pwned") is None
            page.screenshot(path=str(tmp_path / "console.png"), full_page=True)

            page.select_option("#dead-app", "watched")
            page.click("#dead-refresh")
            page.check(f'#dead input[data-call="{dead_id}"]', timeout=10_000)
            page.click("#dead-replay")
            page.wait_for_function("() => document.getElementById('dead-result').textContent === '1 replayed'",
                                   timeout=30_000)
            assert dead_id not in dead_letters(http)  # replayed: a new call, and out of the dead letters

            page.reload()  # signed in for the session: the token is in session storage, not the URL
            page.wait_for_selector('#apps tr[data-app="watched"]', timeout=30_000)
            page.click("#sign-out")
            assert page.evaluate("sessionStorage.getItem('ember.token')") is None
            assert page.is_visible("#sign-in")
    finally:
        stop.set()
        sender.join()
    assert problems == []  # no script error and no Content-Security-Policy violation
    print(f"screenshot: {tmp_path / 'console.png'}")
