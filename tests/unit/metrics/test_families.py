"""/metrics' families from the control plane's state, parsed back by prometheus_client's own parser."""

from __future__ import annotations

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from ember.wire import (
    DeviceView,
    FunctionStats,
    Histogram,
    NodeInfo,
    NodeView,
    ReplicaStatus,
    ServiceStatus,
    StartPhases,
    StatusView,
)
from ember_platform.metrics import state
from ember_platform.metrics.calls import CallMetrics
from ember_platform.metrics.scrape import Visible


def _hist(*counts: int) -> Histogram:
    return Histogram(bounds=[0.01, 0.1], counts=list(counts), sum=0.05 * sum(counts), count=sum(counts))


def _replica(rid: str, app: str, node: str = "n1", state_: str = "ready") -> ReplicaStatus:
    stats = FunctionStats(function="f", calls=7, batches=3, expired=1, rejected=0, cancelled=0, failed=2,
                          queue_depth=4, fill_ratio=0.5, batch_size=_hist(1, 2, 0), queue_wait_s=_hist(5, 2, 0),
                          run_s=_hist(0, 3, 0), in_flight=2)
    start = StartPhases(kind="zygote", fetch_s=0.0, interpreter_s=0.0, imports_s=0.0, setup_s=0.2, ready_s=0.3,
                        fork_s=0.05)
    return ReplicaStatus(replica_id=rid, node_id=node, app=app, service="svc", version=2, state=state_,  # type: ignore[arg-type]
                         pid=1, started_at=0, updated_at=0, functions=[stats], start=start)


def _view() -> StatusView:
    gpu = DeviceView(kind="gpu", index=0, name="NVIDIA H100", uuid="GPU-1", memory_total_mb=81920,
                     memory_free_mb=61440, memory_reserved_mb=40960, utilization=0.42, replicas=["r1"])
    cpu = DeviceView(kind="cpu", index=0, name="cpu", memory_total_mb=1024)
    node = NodeView(node_id="n1", hostname="host-1", updated_at=0, devices=[gpu, cpu])
    svc = ServiceStatus(app="a", service="svc", version=2, functions=["f"], min_replicas=1, max_replicas=4,
                        desired=3, ready=2, pending=5)
    return StatusView(nodes=[node], services=[svc])


def _scrape(*collectors: object) -> dict[str, list[tuple[str, dict[str, str], float]]]:
    registry = CollectorRegistry(auto_describe=False)
    for c in collectors:
        registry.register(c)  # type: ignore[arg-type]
    text = generate_latest(registry).decode()
    return {f.name: [(s.name, s.labels, s.value) for s in f.samples] for f in text_string_to_metric_families(text)}


class _Families:
    def __init__(self, *families: object) -> None:
        self.families = families

    def collect(self):  # type: ignore[no-untyped-def]
        return iter(self.families)


def _all(sees=lambda app: True):  # type: ignore[no-untyped-def]
    replicas = [_replica("r1", "a"), _replica("r2", "b", state_="starting")]
    nodes = {"n1": NodeInfo(node_id="n1", hostname="host-1", devices=[], updated_at=0,
                            replica_gpu_memory_mb={"r1": {"GPU-1": 1536}})}
    families = list(state.all_families(_view(), replicas, nodes, {("a", "svc"): 3}))
    return _scrape(Visible(_Families(*families), sees))  # type: ignore[arg-type]


def test_replica_counters_histograms_and_states() -> None:
    scraped = _all()
    labels = {"app": "a", "function": "f", "version": "2", "replica": "r1"}
    assert ("ember_calls_total", labels, 7.0) in scraped["ember_calls"]
    assert ("ember_calls_failed_total", labels, 2.0) in scraped["ember_calls_failed"]
    assert ("ember_queue_depth", labels, 4.0) in scraped["ember_queue_depth"]
    waits = {s[1].get("le"): s[2] for s in scraped["ember_queue_wait_seconds"] if s[1]["replica"] == "r1"}
    assert (waits["0.01"], waits["0.1"], waits["+Inf"], waits[None]) == (5.0, 7.0, 7.0, 0.35000000000000003)
    states = {(s[1]["app"], s[1]["state"]): s[2] for s in scraped["ember_replicas"]}
    assert states[("a", "ready")] == 1 and states[("a", "starting")] == 0 and states[("b", "starting")] == 1
    phases = {s[1]["phase"]: s[2] for s in scraped["ember_replica_start_seconds"] if s[1]["replica"] == "r1"}
    assert phases["fork"] == 0.05 and phases["ready"] == 0.3 and "first_call" not in phases


def test_the_autoscaler_queues_and_in_flight() -> None:
    scraped = _all()
    assert scraped["ember_autoscaler_desired_replicas"] == [
        ("ember_autoscaler_desired_replicas", {"app": "a", "service": "svc"}, 3.0)]
    assert scraped["ember_autoscaler_ready_replicas"][0][2] == 2.0
    assert scraped["ember_queued_calls"][0][2] == 5.0
    assert scraped["ember_requests_in_flight"] == [("ember_requests_in_flight", {"app": "a", "service": "svc"}, 3.0)]


def test_gpus_under_dcgm_and_triton_names() -> None:
    scraped = _all()
    (util,) = scraped["DCGM_FI_DEV_GPU_UTIL"]
    assert util[1] == {"gpu": "0", "UUID": "GPU-1", "modelName": "NVIDIA H100", "Hostname": "host-1",
                       "GPU_I_PROFILE": "", "node": "n1"} and util[2] == 42.0
    assert scraped["DCGM_FI_DEV_FB_USED"][0][2] == 20480.0 and scraped["DCGM_FI_DEV_FB_FREE"][0][2] == 61440.0
    assert scraped["nv_gpu_utilization"][0][2] == 0.42
    assert scraped["nv_gpu_memory_total_bytes"][0][2] == 81920 * 2**20
    assert scraped["nv_gpu_memory_used_bytes"][0][2] == 20480 * 2**20
    assert scraped["ember_gpu_memory_reserved_bytes"][0][2] == 40960 * 2**20
    assert scraped["ember_replica_gpu_memory_used_bytes"] == [
        ("ember_replica_gpu_memory_used_bytes",
         {"app": "a", "service": "svc", "replica": "r1", "node": "n1", "gpu_uuid": "GPU-1"}, 1536 * 2**20)]
    assert all(s[1]["UUID"] != "" for s in scraped["DCGM_FI_DEV_GPU_UTIL"])  # the CPU device is not a GPU


def test_a_reader_sees_only_its_apps_samples_and_every_gpu() -> None:
    scraped = _all(sees=lambda app: app == "b")
    apps = {s[1]["app"] for family in scraped.values() for s in family if "app" in s[1]}
    assert apps == {"b"}
    assert scraped["DCGM_FI_DEV_GPU_UTIL"]  # nodes and devices are shown to every reader
    assert scraped["ember_replica_gpu_memory_used_bytes"] == []


def test_call_metrics_parse_back() -> None:
    metrics = CallMetrics()
    for code in (200, 200, 200, 422):
        metrics.record("a", "f", 2, code, 0.003)
    scraped = _scrape(metrics.registry())
    counts = {s[1]["code"]: s[2] for s in scraped["ember_requests"]}
    assert counts == {"200": 3.0, "422": 1.0}
    (count,) = [s[2] for s in scraped["ember_request_duration_seconds"] if s[0].endswith("_count")]
    assert count == 4.0


def test_running_sequences_per_replica_only_for_continuous_steps() -> None:
    plain = _replica("r1", "a")
    step = msgspec.structs.replace(plain.functions[0], function="step", sequences=3)
    both = msgspec.structs.replace(plain, functions=[plain.functions[0], step])
    scraped = _scrape(_Families(*state.replica_families([both])))
    assert scraped["ember_replica_running_sequences"] == [
        ("ember_replica_running_sequences", {"app": "a", "function": "step", "version": "2", "replica": "r1"}, 3.0)]
