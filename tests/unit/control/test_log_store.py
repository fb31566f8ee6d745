"""``LogStore``: the last lines of each (app, service), an app's dropped at its deletion and a service's once no
running version has it, and a cap on the bytes kept in all that sheds the oldest lines of the biggest first."""

from __future__ import annotations

from ember.wire import Deployment, FunctionSpec, LogLine, Manifest, ServiceSpec, TrafficShare
from ember.wire.specs import Release
from ember_platform.control.logfeed import LogFilter
from ember_platform.control.logstore import LogStore, running_services, size


def line(text: str, ts: float = 0.0) -> LogLine:
    return LogLine(replica_id="r", stream="stdout", line=text, ts=ts)


def texts(store: LogStore, app: str, service: str | None = None) -> list[str]:
    return [kept.line for kept in store.lines(LogFilter(app=app, service=service), 10_000)]


def test_each_key_keeps_its_last_lines() -> None:
    store = LogStore(lines_kept=3, max_bytes=1 << 30)
    for i in range(5):
        store.add("a", "s", line(str(i), 1 + i))
    assert texts(store, "a") == ["2", "3", "4"]
    assert store.total == sum(size(line(str(i))) for i in range(2, 5))


def test_an_app_or_a_service_no_longer_running_is_forgotten() -> None:
    store = LogStore(lines_kept=10, max_bytes=1 << 30)
    store.add("a", "web", line("w"))
    store.add("a", "batch", line("b"))
    store.add("b", "web", line("other"))
    store.keep("a", {"web"})
    assert store.keys() == [("a", "web"), ("b", "web")]
    store.keep("a", ())
    assert store.keys() == [("b", "web")]
    assert texts(store, "a") == []
    assert store.total == size(line("other"))


def test_beyond_the_cap_the_oldest_lines_of_the_biggest_go_first() -> None:
    one = size(line("x" * 100))
    store = LogStore(lines_kept=1000, max_bytes=100 * one)
    for i in range(10):
        store.add("quiet", "s", line("x" * 100, 1 + i))
    for i in range(200):  # a chatty app: far beyond the cap on its own
        store.add("chatty", "s", line("y" * 100, 100 + i))
    assert store.total <= 100 * one
    assert len(texts(store, "quiet")) == 10  # untouched: the biggest paid
    chatty = store.lines(LogFilter(app="chatty"), 10_000)
    assert chatty and chatty[-1].ts == 299 and [k.ts for k in chatty] == sorted(k.ts for k in chatty)


def test_many_keys_at_the_cap_stay_under_it() -> None:
    one = size(line("z"))
    store = LogStore(lines_kept=1000, max_bytes=50 * one)
    for i in range(500):
        store.add(f"app-{i}", "s", line("z", 1 + i))
    assert store.total <= 50 * one
    assert sum(len(texts(store, f"app-{i}")) for i in range(500)) * one == store.total


def test_the_running_services_of_a_deployment() -> None:
    def manifest(*services: str) -> Manifest:
        return Manifest(app="a", module="a", services=[ServiceSpec(name=s, kind="function", functions=[
            FunctionSpec(name=f"{s}_f", attr="f", input_mode="single")]) for s in services])

    dep = Deployment(app="a", version=2, bundle_sha256="b", manifest=manifest("new"), created_at=0.0,
                     releases=[Release(version=1, bundle_sha256="b", manifest=manifest("old", "both"), created_at=0.0)],
                     traffic=[TrafficShare(version=1, percent=100)])
    assert running_services(dep) == {"new", "old", "both"}
    assert running_services(None) == set()
