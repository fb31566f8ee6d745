"""Which bundles the platform collects: none that a kept version uses, none uploaded recently."""

from __future__ import annotations

import math
from datetime import UTC, datetime

from ember_platform.control.bundle_gc import HistoryEntry, StoredBundle, kept_bundles, unreferenced, upload_time


def test_history_of_a_deployed_app_is_kept() -> None:
    history = [HistoryEntry("a", 1, "v1"), HistoryEntry("a", 3, "v2"), HistoryEntry("b", 2, "b1")]
    assert kept_bundles(history) == {"v1", "v2", "b1"}


def test_a_deleted_app_keeps_nothing() -> None:
    history = [HistoryEntry("a", 1, "v1"), HistoryEntry("a", 4, None), HistoryEntry("b", 2, "v1")]
    assert kept_bundles(history) == {"v1"}  # still b's
    assert kept_bundles([HistoryEntry("a", 1, "v1"), HistoryEntry("a", 4, None)]) == set()


def test_an_app_deployed_again_after_a_delete_keeps_its_history() -> None:
    history = [HistoryEntry("a", 5, "v2"), HistoryEntry("a", 1, "v1"), HistoryEntry("a", 3, None)]
    assert kept_bundles(history) == {"v1", "v2"}


def test_unreferenced_and_old_is_collected() -> None:
    stored = [StoredBundle("used", 0.0), StoredBundle("old", 0.0), StoredBundle("young", 990.0),
              StoredBundle("unknown", math.inf)]
    assert unreferenced(stored, {"used"}, now=1000.0, grace_s=60.0) == ["old"]
    assert unreferenced(stored, {"used"}, now=1050.0, grace_s=60.0) == ["old", "young"]
    assert unreferenced(stored, set(), now=1000.0, grace_s=0.0) == ["old", "used", "young"]


def test_upload_time_reads_rfc3339() -> None:
    when = datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=UTC)
    assert upload_time(when.isoformat()) == when.timestamp()
    assert upload_time("2024-05-01T12:00:00.123456789Z") == when.timestamp()  # Go's nanoseconds
    assert upload_time("2024-05-01T12:00:00Z") == datetime(2024, 5, 1, 12, tzinfo=UTC).timestamp()
    for unknown in (None, "", "yesterday", "2024-05-01T12:00:00"):
        assert upload_time(unknown) == math.inf
