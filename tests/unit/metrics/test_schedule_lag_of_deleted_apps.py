"""A run of a deleted app's schedule that starts after the deletion (its call was queued before) adds no
``ember_schedule_lag_seconds`` series: it stayed in ``/metrics`` until the next change of the deployments."""

from __future__ import annotations

from types import SimpleNamespace

from ember_platform.control.schedules import ScheduleLoop, ScheduleMetrics
from ember_platform.metrics import series


def test_a_deleted_apps_last_run_makes_no_lag_series() -> None:
    loop = SimpleNamespace(_deployments=SimpleNamespace(items={"kept": object()}), metrics=ScheduleMetrics())
    ScheduleLoop._started(loop, "kept", 10.0, 10.5)  # type: ignore[arg-type]
    ScheduleLoop._started(loop, "gone", 10.0, 10.5)  # type: ignore[arg-type]
    assert {labels for labels, _ in series.of(loop.metrics.lag, ("app",))} == {("kept",)}
