"""Every stream, bucket and object store has limits, read from the environment."""

from __future__ import annotations

import pytest
from nats.js.api import DiscardPolicy, StreamConfig

from ember.wire import subjects
from ember.wire.jetstream import CALL_TTL_S, GiB, MiB, StorageLimits, limits_differ

EVERY_STREAM = {"EMBER_CALLS", "EMBER_DEAD", "KV_ember_calls", "KV_ember_deployments", "KV_ember_assignments",
                "KV_ember_nodes", "KV_ember_replicas", "KV_ember_results", "OBJ_ember_bundles", "EMBER_LOGS",
                "KV_ember_tokens", "KV_ember_quotas", "KV_ember_secrets", "KV_ember_volumes", "OBJ_ember_volume_chunks",
                "KV_ember_subject_grants", "KV_ember_owners"}


def test_every_stream_has_a_size_limit() -> None:
    streams = StorageLimits().streams()
    assert set(streams) == EVERY_STREAM
    assert all(limits["max_bytes"] > 0 for limits in streams.values())
    assert streams[subjects.CALLS_STREAM] == {"max_bytes": GiB, "max_msgs": 1_000_000, "discard": DiscardPolicy.NEW,
                                              "max_consumers": 100_000}
    assert streams["KV_ember_results"]["max_age"] >= CALL_TTL_S  # a large result never expires before its record
    assert streams["KV_ember_deployments"] == {"max_bytes": 64 * MiB, "max_msg_size": 4 * MiB}
    assert streams["KV_ember_tokens"]["max_bytes"] == 16 * MiB
    assert streams["KV_ember_quotas"] == {"max_bytes": 4 * MiB, "max_msg_size": 64 * 1024}
    assert streams["KV_ember_secrets"] == {"max_bytes": 16 * MiB, "max_msg_size": 128 * 1024}
    assert streams["KV_ember_subject_grants"] == {"max_bytes": 4 * MiB, "max_msg_size": 64 * 1024}
    assert streams["KV_ember_owners"] == {"max_bytes": 64 * MiB, "max_msg_size": 64 * 1024}


def test_limits_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EMBER_CALLS_STREAM_MAX_BYTES", "1000")
    monkeypatch.setenv("EMBER_BUNDLES_STORE_MAX_BYTES", "-1")
    limits = StorageLimits.from_env()
    assert limits.calls_stream_max_bytes == 1000
    assert limits.bundles_store_max_bytes == -1
    assert limits.results_store_max_bytes == 4 * GiB
    assert StorageLimits.env_name("control_kv_max_bytes") == "EMBER_CONTROL_KV_MAX_BYTES"
    monkeypatch.setenv("EMBER_TOKENS_KV_MAX_BYTES", "2000")
    assert StorageLimits.from_env().tokens_kv_max_bytes == 2000
    monkeypatch.setenv("EMBER_QUOTAS_KV_MAX_BYTES", "3000")
    assert StorageLimits.from_env().quotas_kv_max_bytes == 3000
    monkeypatch.setenv("EMBER_SECRETS_KV_MAX_BYTES", "4000")
    assert StorageLimits.from_env().secrets_kv_max_bytes == 4000
    monkeypatch.setenv("EMBER_CALLS_STREAM_MAX_CONSUMERS", "-1")  # no limit: the most the server takes, not its 1,000
    assert StorageLimits.from_env().streams()[subjects.CALLS_STREAM]["max_consumers"] == 2**31 - 1


@pytest.mark.parametrize("value", ["0", "-2", "1.5", "a lot"])
def test_bad_limits_are_refused_by_name(monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    monkeypatch.setenv("EMBER_DEAD_STREAM_MAX_BYTES", value)
    with pytest.raises(ValueError, match="EMBER_DEAD_STREAM_MAX_BYTES"):
        StorageLimits.from_env()


def test_limits_differ_reads_a_server_config() -> None:
    old = StreamConfig.from_response({"name": "EMBER_CALLS", "max_bytes": -1, "max_msgs": -1, "discard": "old",
                                      "max_age": 0, "max_consumers": 1000})  # nats-server 2.15's default
    wanted = StorageLimits().streams()[subjects.CALLS_STREAM]
    assert set(limits_differ(old, wanted)) == {"max_bytes", "max_msgs", "discard", "max_consumers"}
    now = StreamConfig.from_response({"name": "EMBER_CALLS", "max_bytes": GiB, "max_msgs": 1_000_000,
                                      "discard": "new", "max_consumers": 100_000})
    assert limits_differ(now, wanted) == {}
    results = StreamConfig.from_response({"name": "KV_ember_results", "max_bytes": 4 * GiB, "allow_direct": True,
                                          "max_age": 86_700 * 10**9, "max_msg_size": 256 * 1024 + 4096})
    assert limits_differ(results, StorageLimits().streams()["KV_ember_results"]) == {}
    # A bucket created before a replica read its records by key gets direct gets (and nothing else changes).
    calls = StreamConfig.from_response({"name": "KV_ember_calls", "max_bytes": GiB})
    assert limits_differ(calls, StorageLimits().streams()["KV_ember_calls"]) == {"allow_direct": (None, True)}


def test_an_apps_share_of_the_queue_follows_the_queues_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (StorageLimits().calls_stream_max_bytes_per_app, StorageLimits().calls_stream_max_msgs_per_app) == \
        (GiB // 4, 250_000)
    monkeypatch.setenv("EMBER_CALLS_STREAM_MAX_BYTES", str(4 * GiB))
    monkeypatch.setenv("EMBER_CALLS_STREAM_MAX_MSGS", "-1")
    limits = StorageLimits.from_env()
    assert (limits.calls_stream_max_bytes_per_app, limits.calls_stream_max_msgs_per_app) == (GiB, -1)
    monkeypatch.setenv("EMBER_CALLS_STREAM_MAX_BYTES_PER_APP", "1000")
    assert StorageLimits.from_env().calls_stream_max_bytes_per_app == 1000
