"""Every NATS subject, KV bucket and object-store name Ember uses, built in one place.

Nothing else formats a subject string. Tokens are validated so that a name can never add or remove
a subject level.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Awaitable, Callable
from functools import lru_cache
from typing import Any

DEFAULT_TENANT = "default"

# JetStream streams: asynchronous calls (a work queue) and the calls that failed their last attempt.
CALLS_STREAM = "EMBER_CALLS"
CALLS_ALL = "ember.calls.>"
DEAD_STREAM = "EMBER_DEAD"
DEAD_ALL = "ember.dead.>"

# JetStream buckets.
DEPLOYMENTS_BUCKET = "ember_deployments"  # key: <app>          value: wire.Deployment
REPLICAS_BUCKET = "ember_replicas"  # key: <node id>.<replica id>  value: wire.ReplicaStatus (its node's key alone)
ASSIGNMENTS_BUCKET = "ember_assignments"  # key: <node id>    value: wire.NodeAssignment
NODES_BUCKET = "ember_nodes"  # key: <node id>                 value: wire.NodeInfo
CALLS_BUCKET = "ember_calls"  # keys: s.<app>.<call id> (status), r.<app>.<call id> (result, first writer wins),
# k.<app>.<key hash> (an idempotency key's call id): one key space per app, so that NATS permissions confine a replica
RESULTS_BUCKET = "ember_results"  # key: <app>.<call id>.<writer>.<n>  value: chunk n of a result too large for a record
BUNDLES_STORE = "ember_bundles"  # object name: <sha256>       value: bundle archive
TOKENS_BUCKET = "ember_tokens"  # key: <token id>             value: wire.StoredToken (the control plane's alone)
QUOTAS_BUCKET = "ember_quotas"  # key: <quota name>           value: wire.Quota (the control plane's alone)
VOLUMES_BUCKET = "ember_volumes"  # key: <volume>.<version>   value: wire.VolumeVersion (the files and their chunks)
VOLUME_CHUNKS_STORE = "ember_volume_chunks"  # object name: <sha256>  value: one chunk of a volume's file
SECRETS_BUCKET = "ember_secrets"  # key: <secret name>      value: wire.StoredSecret, encrypted (control plane only)
SCHEDULES_BUCKET = "ember_schedules"  # key: <app>.<function>  value: wire.schedules.ScheduleState (control plane only)
MODELS_BUCKET = "ember_models"  # key: model_key(<model name>)  value: the app that holds the name (control plane only)
OWNERS_BUCKET = "ember_owners"  # key: <kind>.<sha256>     value: its uploaders' app patterns (control plane only)
SUBJECT_GRANTS_BUCKET = "ember_subject_grants"  # key: sha256 of a pattern  value: wire.grants.SubjectGrant (the
# control plane's alone: no replica or node may read or write it)

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")


def _token(value: str, what: str) -> str:
    if not _TOKEN.fullmatch(value):
        raise ValueError(f"{what} {value!r} may hold only letters, digits, '-' and '_'")
    return value


def is_token(value: str) -> bool:
    """Whether ``value`` is one subject token (letters, digits, '-', '_')."""
    return _TOKEN.fullmatch(value) is not None


def check_token(value: str, what: str) -> str:
    """``value`` if it is one subject token (letters, digits, '-', '_'), else ``ValueError`` naming ``what``."""
    return _token(value, what)


MODEL_NAME = r"[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,127}"  # a served model's name (openai="...")
_MODEL_NAME = re.compile(MODEL_NAME)


def model_key(name: str) -> str:
    """The ``ember_models`` key of a served model's name (hex: a name may hold ':', '@' and '+', which a key may not);
    ``ValueError`` for a name that is none."""
    if not _MODEL_NAME.fullmatch(name):
        raise ValueError(f"model name {name[:80]!r}: 1 to 128 letters, digits and '._:/@+-'")
    return name.encode().hex()


def _fn_token(name: str) -> str:
    # "Classifier.predict" -> "Classifier-predict": '.' separates subject levels, and Python names
    # never contain '-', so the mapping is one-to-one.
    return "-".join(_token(part, "function name") for part in name.split("."))


@lru_cache(maxsize=4096)  # built for every synchronous call
def invoke(app: str, function: str, version: int, tenant: str = DEFAULT_TENANT) -> str:
    """Synchronous calls to one version of a function, load-balanced over its replicas."""
    return f"ember.invoke.{_token(tenant, 'tenant')}.{_token(app, 'app')}.{_fn_token(function)}.v{version}"


@lru_cache(maxsize=4096)  # built for every synchronous call
def replica_invoke(replica_id: str) -> str:
    """Calls routed to one replica."""
    return f"ember.replica.{_token(replica_id, 'replica id')}.invoke"


@lru_cache(maxsize=4096)  # built for every synchronous call
def replica_cancel(replica_id: str) -> str:
    """Call ids whose callers went away, for the replica holding them."""
    return f"ember.replica.{_token(replica_id, 'replica id')}.cancel"


# Call ids cancelled while running, for every control plane's relay (which cancels the calls they made in turn).
# Control planes alone publish and read it: no replica's or node's permissions name it.
CANCELLED_CALLS = "ember.control.cancelled"
# "<control plane> <app> <service>": a synchronous call waits at that control plane for a service with no replica,
# for the lease holder's autoscaler (calls reach any control plane). Control planes alone publish and read it.
UNSERVED_CALLS = "ember.control.unserved"


@lru_cache(maxsize=4096)
def replica_credit(replica_id: str) -> str:
    """Flow control of the streams a replica sends: how many items each stream's reader can take (``StreamCredit``)."""
    return f"ember.replica.{_token(replica_id, 'replica id')}.credit"


def replica_standby(replica_id: str) -> str:
    """A control plane's word (``STANDBY``) to a replica whose version is out of the traffic: pull no queued call
    for a while. Only a control plane may publish here."""
    return f"ember.replica.{_token(replica_id, 'replica id')}.standby"


STANDBY = b"1"  # what a replica out of the traffic is told: pull nothing from the shared queues for a while


@lru_cache(maxsize=4096)
def replica_status(replica_id: str) -> str:
    """A replica's own state, which its node agent writes to ``ember_replicas`` (a replica writes no bucket)."""
    return f"ember.replica.{_token(replica_id, 'replica id')}.status"


REPLICA_STATUS_ALL = "ember.replica.*.status"


def replica_key(node_id: str, replica_id: str) -> str:
    """A replica's key in ``ember_replicas``: under its node's id, so that a node's permissions let it write the
    statuses of its own replicas only (``ember_platform.control.replica_mirror`` checks the rest)."""
    return f"{_token(node_id, 'node id')}.{_token(replica_id, 'replica id')}"


def replica_keys_of_node(node_id: str) -> str:
    """Every replica key one node may write (its permission)."""
    return f"{_token(node_id, 'node id')}.*"

# Answers to synchronous calls: ``<root>.<gateway id>.<app>.<frame token>``. A replica may publish only under its
# own app, and a frame's token is random, so it can answer only the frames it was sent.
ANSWERS_ROOT = "_EMBER.answers"


def answers_inbox(gateway_id: str) -> str:
    return f"{ANSWERS_ROOT}.{_token(gateway_id, 'gateway id')}"


STREAM_BUNDLE = "bundle"  # the last token of a stream bundle's subject (a reply token is 16 hex digits: never this)


def stream_bundle(reply: str) -> tuple[str, str] | None:
    """For a stream's reply subject ``<root>.<gateway id>.<app>.<token>``: the subject of the bundles that carry its
    messages together with those of the gateway's other streams of the app (``<root>.<gateway id>.<app>.bundle``),
    and its token. None for any other subject (its messages then go alone)."""
    parts = reply.rsplit(".", 3)
    if len(parts) != 4:
        return None
    root, gateway, app, token = parts
    if root != ANSWERS_ROOT or not all(map(_TOKEN.fullmatch, (gateway, app, token))) or token == STREAM_BUNDLE:
        return None
    return f"{root}.{gateway}.{app}.{STREAM_BUNDLE}", token


def answers_of_app(app: str) -> str:
    """Every gateway's answer subjects of one app's frames (a replica's publish permission)."""
    return f"{ANSWERS_ROOT}.*.{_token(app, 'app')}.*"


def call_key(kind: str, app: str, call_id: str) -> str:
    """A call's key in ``ember_calls``: ``s`` (status), ``r`` (final record) or ``k`` (an idempotency key's hash, in
    place of the call id), under its app's name: a replica's permissions reach only its own app's keys."""
    return f"{kind}.{_token(app, 'app')}.{call_id}"


def calls_keys_of_app(kind: str, app: str) -> str:
    """Every ``kind`` key of one app in ``ember_calls`` (a replica's permission)."""
    return f"{kind}.{_token(app, 'app')}.>"


# Results of events published to a requester (``Ember-Reply-To``): ``<root>.<app>.<anything>``. A replica may publish
# only under its own app, and an event client subscribe only under its token's apps.
EVENT_REPLIES_ROOT = "_EMBER.replies"


def event_replies(app: str) -> str:
    """Every reply subject of one app's events (a replica's publish permission, an event client's subscription)."""
    return f"{EVENT_REPLIES_ROOT}.{_token(app, 'app')}.>"


def relay(replica_id: str) -> str:
    """Calls a replica's code makes to other functions (``ember.wire.relay``), answered by a control plane. Only that
    replica may publish here (its NATS permissions), so the subject names the caller."""
    return f"ember.relay.{_token(replica_id, 'replica id')}"


RELAY_ALL = "ember.relay.*"


def node_secrets(node_id: str) -> str:
    """A node agent's requests for the secrets of a replica it starts (answered by a control plane's queue group)."""
    return f"ember.node.{_token(node_id, 'node id')}.secrets"


NODE_SECRETS_ALL = "ember.node.*.secrets"


def node_builds(node_id: str) -> str:
    """Builds a control plane asks of one node (``wire.images.BuildRequest``): only that node's agent may read them."""
    return f"ember.node.{_token(node_id, 'node id')}.build"


def node_build_events(node_id: str) -> str:
    """A node's word on the builds it runs (``wire.images.BuildEvent``): only that node's agent may publish here."""
    return f"ember.node.{_token(node_id, 'node id')}.build-events"


NODE_BUILD_EVENTS_ALL = "ember.node.*.build-events"


def replica_group(app: str, service: str, version: int) -> str:
    """Queue group shared by the replicas of one service version."""
    return f"{_token(app, 'app')}.{_token(service, 'service')}.v{version}"


def logs(app: str, service: str, node_id: str) -> str:
    """Log lines of the replicas of one service, published by the agent of node ``node_id`` (the only one whose
    NATS permissions allow this subject: a line is shown with the node that published it)."""
    return f"ember.logs.{_token(app, 'app')}.{_token(service, 'service')}.{_token(node_id, 'node id')}"


def node_logs(node_id: str) -> str:
    """Every log subject one node agent may publish to."""
    return f"ember.logs.*.*.{_token(node_id, 'node id')}"


LOGS_ALL = "ember.logs.>"
LOGS_STREAM = "EMBER_LOGS"  # every log line, kept (bounded) so that the logs API outlives a control plane restart


def calls(app: str, function: str, tenant: str = DEFAULT_TENANT) -> str:
    """JetStream work queue of one function's asynchronous calls."""
    return f"ember.calls.{_token(tenant, 'tenant')}.{_token(app, 'app')}.{_fn_token(function)}"


def calls_consumer(app: str, function: str) -> str:
    """The durable pull consumer of one function's queued calls."""
    return f"{_token(app, 'app')}--{_fn_token(function)}"


def pinned_calls(app: str, function: str, version: int, tenant: str = DEFAULT_TENANT) -> str:
    """The asynchronous calls of one function pinned to one version (``/v1/<app>@<version>/<fn>/spawn``)."""
    return f"{calls(app, function, tenant)}.v{int(version)}"


def pinned_calls_consumer(app: str, function: str, version: int) -> str:
    """The durable pull consumer of one version's pinned calls: ``<app>--<fn>--<version>`` (a function's token
    never is a number, so no other consumer has this name)."""
    return f"{calls_consumer(app, function)}--{int(version)}"


def dead(app: str, function: str, tenant: str = DEFAULT_TENANT) -> str:
    """Dead letters of one function."""
    return f"ember.dead.{_token(tenant, 'tenant')}.{_token(app, 'app')}.{_fn_token(function)}"


def events_stream(app: str, function: str) -> str:
    """The work-queue stream that captures the subjects a function is bound to (``on=``)."""
    return f"EMBER_EV_{_token(app, 'app')}_{_fn_token(function)}"


def event_scope(stream: str) -> str:
    """A short digest of an event stream's name: the part of an event's call id that names its function (and so its
    app: ``ev-<scope>-<message id>``, ``evs-<scope>-<stored at>-<sequence>``)."""
    return hashlib.sha256(stream.encode()).hexdigest()[:12]


def dead_of_app(app: str, tenant: str = DEFAULT_TENANT) -> str:
    """Dead letters of every function of an app."""
    return f"ember.dead.{_token(tenant, 'tenant')}.{_token(app, 'app')}.*"


STATS_ALL = "ember.stats.>"


def stats(app: str, function: str) -> str:
    """Load reports of one function's replicas."""
    return f"ember.stats.{_token(app, 'app')}.{_fn_token(function)}"


def node_fetch(node_id: str) -> str:
    """A node agent's reads of what is assigned to it (``ember.wire.nodereads``): its assignment, and the bundles,
    volume versions and chunks its replicas, zygotes and builds need. Only that node may publish here (its NATS
    permissions); a control plane's queue group answers, after checking the node's assignment."""
    return f"ember.node.{_token(node_id, 'node id')}.fetch"


NODE_FETCH_ALL = "ember.node.*.fetch"


def assignment_updates(node_id: str) -> str:
    """The subject of one node's key in ``ember_assignments``: that node subscribes to it (no consumer, no read of
    another node's key) and asks a control plane for the current value (``node_fetch``)."""
    return f"$KV.{ASSIGNMENTS_BUCKET}.{_token(node_id, 'node id')}"


def matches(pattern: str, subject: str) -> bool:
    """Whether NATS delivers ``subject`` to a subscription of ``pattern`` (``*``: one token, ``>``: the rest)."""
    return _matcher(pattern)(subject)


def _matcher(pattern: str) -> Callable[[str], bool]:
    """``matches`` for one pattern, its tokens split once."""
    if "*" not in pattern and ">" not in pattern:
        return pattern.__eq__
    want = pattern.split(".")

    def match(subject: str) -> bool:
        got = subject.split(".")
        for i, token in enumerate(want):
            if token == ">":
                return len(got) > i
            if i >= len(got) or (token != "*" and token != got[i]):
                return False
        return len(got) == len(want)

    return match


def only_on(pattern: str, handler: Callable[[Any], Awaitable[None]], *,
            statuses: bool = False) -> Callable[[Any], Awaitable[None]]:
    """``handler`` for a subscription to ``pattern``, dropping a message whose subject ``pattern`` does not match.

    A subscription gets whatever NATS delivers to its subject, and that includes a message a JetStream consumer
    delivers to the reply subject of a pull request (``$JS.API.CONSUMER.MSG.NEXT``): NATS checks no permission on a
    reply subject, so a replica could have its own stream's messages (an event's body of its choosing) delivered to
    another subscription. Such a message keeps its stream's subject, which is how it is told apart. A server's status
    message (a ``Status`` header: no messages, a timeout, no responders) answers a request, and is never one of
    Ember's own messages either: it is dropped too, unless ``statuses`` (a subscription that receives the answers to
    its own requests: "no responders" is one)."""
    match = _matcher(pattern)

    async def guarded(msg: Any) -> None:
        if match(msg.subject) and (statuses or not (msg.headers and "Status" in msg.headers)):
            await handler(msg)

    return guarded
