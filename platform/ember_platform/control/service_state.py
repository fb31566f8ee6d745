"""What the control loop keeps of each service between its ticks, and of each rebalancing move in flight."""

from __future__ import annotations

from dataclasses import dataclass, field

from ember.wire import Deployment
from ember_platform.scheduler import AutoscaleState, Meter, Move


@dataclass
class ServiceState:
    autoscale: AutoscaleState
    meter: Meter = field(default_factory=Meter)  # load measured from the replicas' reports
    unschedulable: str = ""  # why the last placement failed, for `ember status`
    desired: int = 0
    arrival_rate: float = 0.0  # calls per second to the current version, as last measured
    quota: str = ""  # why a quota holds the service below what it wants, for `ember status`
    quiet_as: Deployment | None = None  # the deployment it was last reconciled to no replica at all as (``_quiet``)
    quiet_received: int = -1  # the gateway's count of its calls then
    gave_way: set[str] = field(default_factory=set)  # its replicas counted in ``ControlLoop.replaced``
    last_replaced: tuple[float, str] = (0.0, "")  # when the last of them was seen giving way, and why


@dataclass
class Moving:
    """A rebalancing move in flight: ``move.binding``'s replica replaces ``move.replica_id`` once ready."""

    move: Move
    since: float
