"""The control plane's process state: one NATS connection, the registry and the router."""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from nats.aio.client import Client
from nats.js.errors import APIError, ServiceUnavailableError

from ember.wire import assignment_decoder
from ember.wire.images import ImageSpec
from ember.wire.jetstream import KVMirror, StorageLimits, connect
from ember_platform.auth.bootstrap import bootstrap
from ember_platform.auth.tokens import TokenStore
from ember_platform.calls.demand import Demand
from ember_platform.calls.router import Router
from ember_platform.calls.streams import Streams
from ember_platform.config import Settings
from ember_platform.control.builds import Builds
from ember_platform.control.lease import Lease
from ember_platform.control.loop import ControlLoop
from ember_platform.control.node_reads import NodeReads, build_grant
from ember_platform.control.registry import Registry
from ember_platform.control.schedules import ScheduleLoop
from ember_platform.events.grants import GrantStore
from ember_platform.gateway.body import Validators
from ember_platform.gateway.relay import Relay
from ember_platform.metrics.calls import CallMetrics
from ember_platform.metrics.llm import LlmMetrics
from ember_platform.natsauth import keys as auth_keys
from ember_platform.natsauth.callout import AuthCallout
from ember_platform.quotas.store import QuotaStore
from ember_platform.secrets.key import read_key
from ember_platform.secrets.server import SecretsServer
from ember_platform.secrets.store import SecretStore
from ember_platform.volumes.store import VolumeStore

log = logging.getLogger("ember.platform")
SLOW_STOP_S = 2.0  # a part of the control plane that takes longer to stop is named in its log
START_RETRY_S = 60.0  # how long a start waits for a JetStream cluster that cannot place streams yet
_NOT_PLACEABLE = {10005, 10008}  # JetStream: no suitable peers (insufficient resources); cluster not available


def _not_placeable_yet(exc: APIError) -> bool:
    return isinstance(exc, ServiceUnavailableError) or exc.err_code in _NOT_PLACEABLE


class Platform:
    def __init__(self, settings: Settings, nc: Client, registry: Registry, grant_key: bytes | None = None) -> None:
        self.settings = settings
        self.nc = nc
        self.registry = registry
        self.router = Router(nc, registry.replica_alive, registry.replica_of)
        self.streams = Streams(nc, self.router, registry.replica_alive)  # generator functions' calls
        self.calls = registry.calls
        self.validators = Validators()
        self.call_metrics = CallMetrics()  # the call path's counters (GET /metrics)
        self.llm_metrics = LlmMetrics()  # the OpenAI-compatible routes' figures (GET /metrics)
        self.quotas = QuotaStore(registry.stores.quotas)
        self.subject_grants = GrantStore(registry.stores.subject_grants)  # what apps may bind beyond events.<app>
        lease = Lease(nc.jetstream())
        # the calls that wait at the other control planes for a service with no replica count here too
        self.demand = Demand(lease.holder, registry.deployments.changed.set, registry.deployed_service)
        self.control = ControlLoop(registry, registry.stores,
                                   gateway_load=lambda app, svc: (self.router.in_flight[(app, svc)]
                                                                  + self.demand.in_flight(app, svc)),
                                   gateway_received=lambda app, svc: (self.router.received[(app, svc)]
                                                                      + self.demand.received[(app, svc)]),
                                   gateway_capacity=self.router.capacity, js=nc.jetstream(),
                                   lease=lease, quotas=self.quotas.all)
        # a call to a function at zero wakes the control loop as a changed deployment does: its replica is asked for
        # now, not at the next tick (up to TICK_S later); and every other control plane's, one of which may hold the
        # lease
        self.router.on_unserved = self._unserved
        self.schedules = ScheduleLoop(nc.jetstream(), registry.calls, registry.deployments,
                                      active=lambda: self.control.active)  # ticks: fired by the lease holder only
        self.callout: AuthCallout | None = None
        self.tokens = TokenStore(registry.stores.tokens, enabled=settings.auth)
        self.first_token: str | None = None  # an installation's first admin token, created by this start
        fernet = read_key(Path(settings.secrets_key_file)) if settings.secrets_key_file else None
        self.secrets = SecretStore(registry.stores.secrets, fernet)
        self.volumes = VolumeStore(registry.stores.volumes, registry.stores.volume_chunks, nc.jetstream(),
                                   max_value_bytes=StorageLimits.from_env().volumes_kv_max_value_bytes,
                                   max_payload=nc.max_payload)
        self.secrets_server = SecretsServer(nc, self.secrets, registry.stores.assignments, registry.stores.deployments)
        grant = (lambda node, sha: build_grant(grant_key, node, sha)) if grant_key else (lambda _node, _sha: "")
        self.builds = Builds(nc, self.control.live_nodes, registry.has_bundle, self._running_images, grant)  # images
        self.node_reads = NodeReads(nc, registry.stores, lambda: self.control.assignments.items,
                                    self.builds.bundles_building_on, grant_key)  # a node reads what it is assigned
        self.relay = Relay(nc, registry, self.validators, self.router, self.calls, lambda: self.quotas.limiter,
                           registry.stores.assignments, self.streams)  # calls between functions, from replicas

    @classmethod
    async def start(cls, settings: Settings) -> Platform:
        """Connected, with every bucket and stream in place. A JetStream cluster that has just formed may not place
        a replicated stream yet ("no suitable peers for placement": its peers have not all reported): the start
        is tried again, each second for ``START_RETRY_S``, not given up at once (a control plane started with its
        NATS cluster exited, CI's test_nats_cluster)."""
        deadline = time.monotonic() + START_RETRY_S
        while True:
            try:
                return await cls._start_once(settings)
            except APIError as exc:
                if not _not_placeable_yet(exc) or time.monotonic() > deadline:
                    raise
                log.warning("JetStream cannot place Ember's streams yet (%s); starting again in 1 s", exc.description)
                await asyncio.sleep(1.0)

    @classmethod
    async def _start_once(cls, settings: Settings) -> Platform:
        keys = auth_keys.load(Path(settings.nats_auth_dir)) if settings.nats_auth_dir else None
        nc = await connect(settings.nats_url, "ember-platform", keys.platform_credentials() if keys else None)
        registry = Registry(nc, settings.log_lines_kept, settings.ack_wait_s)
        try:
            await registry.start()
            platform = cls(settings, nc, registry, keys.build_grant_key() if keys else None)
            platform.first_token = await bootstrap(platform.tokens, settings.bootstrap_token_file)
            await platform.quotas.start()
            await platform.subject_grants.start()
            await platform.secrets.start()
            await platform.volumes.start()
            await platform.secrets_server.start()
            await platform.node_reads.start()
            await platform.builds.start()
            if keys is not None:
                platform.callout = AuthCallout(nc, keys, KVMirror(registry.stores.assignments,
                                                                  assignment_decoder.decode), registry.deployments,
                                               tokens=platform.tokens,  # event clients present tokens
                                               replica_ttl_s=settings.replica_credentials_ttl_s,
                                               drain_grace_s=settings.replica_drain_grace_s)
                await platform.callout.start()
            await platform.router.start()
            await platform.demand.start(nc)
            await platform.streams.start()
            await platform.relay.start()
            await platform.control.start()
            await platform.schedules.start()
        except BaseException:
            await nc.close()
            raise
        return platform

    async def stop(self) -> None:
        """Each part stopped in turn, then the connection drained. A part slow to stop (a SIGTERM that took long to
        end the process) is named in the log with its time."""
        parts = [("auth callout", self.callout.stop if self.callout is not None else None),
                 ("schedules", self.schedules.stop), ("control loop", self.control.stop),
                 ("control actions", self.control.stop_acting),
                 ("relay", self.relay.stop), ("streams", self.streams.stop), ("router", self.router.stop),
                 ("demand", self.demand.stop),
                 ("registry", self.registry.stop), ("tokens", self.tokens.stop), ("quotas", self.quotas.stop),
                 ("subject grants", self.subject_grants.stop), ("secrets server", self.secrets_server.stop),
                 ("node reads", self.node_reads.stop), ("builds", self.builds.stop), ("secrets", self.secrets.stop),
                 ("volumes", self.volumes.stop), ("NATS drain", self.nc.drain)]
        for name, stop in parts:
            if stop is None:
                continue
            started = time.monotonic()
            await stop()
            if (took := time.monotonic() - started) > SLOW_STOP_S:
                log.warning("stopping: %s took %.1fs", name, took)

    def _unserved(self, app: str, service: str) -> None:
        self.registry.deployments.changed.set()
        self.demand.tell(app, service)

    def _running_images(self, app: str) -> list[ImageSpec]:
        """The locked images of ``app``'s current deployment (a push that did not change one keeps its lock)."""
        dep = self.registry.deployments.items.get(app)
        return [s.image for s in dep.manifest.services if s.image is not None] if dep is not None else []

    def ready(self) -> bool:
        return self.nc.is_connected
