"""Which replica takes a synchronous call: the replicas' load reports and the choice made from them.

``LoadBoard`` keeps the latest report of each replica (per function version) and when it came; ``choose`` is a
pure function of the candidates' reports and of the calls the router sent each one since: power of two
choices, comparing estimated waits (calls ahead times seconds per call) when both replicas measured their
cost, else the counts of calls ahead.
"""

from __future__ import annotations

import random
import statistics
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

from ember.wire import LoadReport

REPORT_FRESH_S = 2.0  # an older report says nothing of a replica's load now (a busy one reports every 0.1 s while
#                      its load changes, every 0.25 s while it holds still; 2 s: a loaded machine's late ones count)
IDLE_FRESH_S = 5.0  # how long an idle replica's report counts (an idle one reports every 2 s, and at once when a
#                     call reaches it; the router adds the calls it sent since, so that "idle" stays true enough)

FORGET_AFTER_S = 60.0  # a replica whose last report stopped counting this long ago is forgotten
SWEEP_EVERY = 1024  # reports recorded between two sweeps

ReportKey = tuple[str, str, int]  # (app, function, version)


class LoadBoard:
    """The replicas' latest load reports, kept per function version and per service, each with the time it stops
    counting: ``fresh_s`` after it came, ``idle_fresh_s`` for a report of nothing queued or running."""

    def __init__(self, fresh_s: float = REPORT_FRESH_S, clock: Callable[[], float] = time.monotonic,
                 idle_fresh_s: float = IDLE_FRESH_S) -> None:
        self._fresh_s = fresh_s
        self._idle_fresh_s = idle_fresh_s
        self._clock = clock
        self._reports: dict[ReportKey, dict[str, tuple[float, LoadReport]]] = {}  # replica -> (until, report)
        self._services: dict[tuple[str, str], set[ReportKey]] = {}  # (app, service) -> its functions' keys
        self._recorded = 0
        self.on_forget: Callable[[str], None] | None = None  # told each replica a sweep forgot entirely

    def record(self, report: LoadReport) -> None:
        key = (report.app, report.function, report.version)
        idle = report.queued == 0 and report.in_flight == 0
        now = self._clock()
        self._reports.setdefault(key, {})[report.replica_id] = (now + (self._idle_fresh_s if idle else self._fresh_s),
                                                                report)
        self._services.setdefault((report.app, report.function.split(".")[0]), set()).add(key)
        self._recorded += 1
        if self._recorded % SWEEP_EVERY == 0:
            self.sweep(now)

    def sweep(self, now: float) -> None:
        """Forget the replicas that stopped reporting ``FORGET_AFTER_S`` ago (gone, or of a version no longer
        served): without this, every replica that ever reported would stay, and ``fresh`` would walk them all."""
        before = {r for reports in self._reports.values() for r in reports}
        self._sweep(now)
        if self.on_forget is not None:
            for replica in before - {r for reports in self._reports.values() for r in reports}:
                self.on_forget(replica)

    def _sweep(self, now: float) -> None:
        for key in list(self._reports):
            live = {r: v for r, v in self._reports[key].items() if now - v[0] < FORGET_AFTER_S}
            if live:
                self._reports[key] = live
                continue
            del self._reports[key]
            service = (key[0], key[1].split(".")[0])
            keys = self._services.get(service)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self._services[service]

    def fresh(self, app: str, function: str, version: int) -> list[LoadReport]:
        """The reports of the function version's replicas that are recent enough to route by."""
        reports = self._reports.get((app, function, version))
        if not reports:
            return []
        now = self._clock()
        return [r for until, r in reports.values() if now < until]

    def capacity(self, app: str, service: str) -> float | None:
        """Calls per second one replica of the service serves in full batches, by the replicas' own estimate:
        one over the median predicted cost of a call (``per_call_s``) in its fresh reports; None without one."""
        now = self._clock()
        costs = [r.per_call_s for key in self._services.get((app, service), ())
                 for until, r in self._reports[key].values() if now < until and r.per_call_s > 0]
        return 1.0 / statistics.median(costs) if costs else None


class Unreported:
    """The streams a gateway sent each replica that no load report of that replica counts yet: those it has not
    accepted, and those it accepted after the count its last report gave (``LoadReport.accepted``; each accept says
    its own number). Race-free whichever of an accept and a report is read first: a report that counts a stream
    says so by its count, not by when it came. Kept per (app, replica): a report counts only for the app whose
    subject it came on (``Router``), so no app's replicas can speak for another app's."""

    def __init__(self) -> None:
        self._awaiting: Counter[tuple[str, str]] = Counter()  # (app, replica) -> streams sent, not accepted yet
        self._uncounted: dict[tuple[str, str], set[int]] = {}  # -> the numbers of its accepts no report counted yet
        self._reported: dict[tuple[str, str], int] = {}  # -> the highest count of accepts its reports gave

    def sent(self, app: str, replica: str) -> None:
        self._awaiting[app, replica] += 1

    def unsent(self, app: str, replica: str) -> None:
        """A stream sent to ``replica`` was accepted (see ``accepted``), refused or given up."""
        self._awaiting[app, replica] -= 1
        if self._awaiting[app, replica] <= 0:
            del self._awaiting[app, replica]

    def accepted(self, app: str, replica: str, number: int) -> None:
        """``replica`` accepted a stream this gateway sent it, its ``number``-th (0: a replica that does not count)."""
        if number > self._reported.get((app, replica), 0):
            self._uncounted.setdefault((app, replica), set()).add(number)

    def reported(self, report: LoadReport) -> None:
        key = (report.app, report.replica_id)
        if report.accepted <= self._reported.get(key, 0):
            return
        self._reported[key] = report.accepted
        left = {n for n in self._uncounted.get(key, ()) if n > report.accepted}
        if left:
            self._uncounted[key] = left
        else:
            self._uncounted.pop(key, None)

    def forget(self, replica: str) -> None:
        """A replica gone: nothing of it is kept."""
        for table in (self._uncounted, self._reported):
            for key in [k for k in table if k[1] == replica]:
                del table[key]

    def count(self, app: str, replica: str) -> int:
        return self._awaiting.get((app, replica), 0) + len(self._uncounted.get((app, replica), ()))


def fewest_running(candidates: Sequence[LoadReport], opened: Mapping[str, int],
                   rng: random.Random | None = None, unreported: Unreported | None = None) -> str | None:
    """The replica to send a new stream to: the one with the fewest running (and queued) sequences, by its last
    report plus the streams this gateway sent it that the report does not count (``unreported``), or by the streams
    this gateway has open on it (``opened``), whichever is more (a report lags a burst of streams; other gateways'
    streams show only in reports); ties at random. None without candidates."""
    if not candidates:
        return None

    def load(report: LoadReport) -> int:
        late = unreported.count(report.app, report.replica_id) if unreported is not None else 0
        return max(report.in_flight + report.queued + late, opened.get(report.replica_id, 0))

    least = min(load(r) for r in candidates)
    return (rng or random).choice([r.replica_id for r in candidates if load(r) == least])


def choose(candidates: Sequence[LoadReport], sent: Mapping[str, int],
           rng: random.Random | None = None) -> str | None:
    """The replica to send a call to among ``candidates`` (fresh, live, not yet tried), or None when there is
    none (the router then uses the queue group). ``sent``: calls sent to each replica and not answered yet,
    which its last report may not count."""
    if len(candidates) < 2:
        return candidates[0].replica_id if candidates else None
    pair = (rng or random).sample(list(candidates), 2)
    timed = all(r.per_call_s > 0 for r in pair)  # compare seconds only when both replicas measured them

    def expected_wait(report: LoadReport) -> float:
        ahead = report.queued + report.in_flight + sent.get(report.replica_id, 0) + 1
        return ahead * (report.per_call_s if timed else 1.0 / max(report.slots, 1))  # per_call_s counts the slots

    return min(pair, key=expected_wait).replica_id
