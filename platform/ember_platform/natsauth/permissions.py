"""What each kind of component may publish and subscribe to, as the ``nats`` part of a user JWT.

Pure functions of names: the callout fills them in for the component that connects. The control plane itself
is not here: it is the server's one configured user, with every permission.

A replica of app A may receive only its own functions' calls (synchronous, queued and events), answer on its
app's answer subjects (and the reply subject of a request it received, once), write its own app's call statuses and
records by key (``s.<app>.>``, ``r.<app>.>`` in ``ember_calls``: no stream info, no message by sequence, so it can
neither list nor read another app's calls), write its own app's large outputs (``ember_results``), publish its own
status and its functions' load reports and dead letters, and
publish event results to its functions' result subjects or to its app's reply subjects (``_EMBER.replies.<app>``).
It cannot read any other bucket, see another app's subjects, write ``ember_replicas`` or publish log lines. Its code
calls other functions only through its own relay subject (``ember.relay.<replica id>``), which a control plane
answers after checking the call (``ember_platform.gateway.relay``): it never publishes another app's invoke subjects.

It reads no bucket at all, not even its own keys: NATS checks no permission on a request's reply subject, and a
JetStream read (a direct get) is answered there by the server, so a value the replica wrote, read with a reply
subject naming a key of another bucket, would be stored under that key. Its queue worker's reads go over the relay
(``RelayCallRead``), which answers only into the replica's own inbox.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ember.wire import subjects
from ember.wire.natscreds import replica_inbox

_UNLIMITED = {"subs": -1, "data": -1, "payload": -1, "type": "user", "version": 2}
# A replica answers the requests it receives (``allow_responses``): one message each, within two minutes (its calls'
# answers and streams go to its app's answer subjects, never to another client's inbox).
_ONE_ANSWER = {"max": 1, "ttl": 120_000_000_000}
_JS = "$JS.API"


def _user(pub: Iterable[str], sub: Iterable[str]) -> dict[str, Any]:
    return {"pub": {"allow": sorted(set(pub))}, "sub": {"allow": sorted(set(sub))}, **_UNLIMITED}


def _kv(bucket: str) -> str:
    return f"KV_{bucket}"


Function = tuple[str, bool, str | None]  # name, bound to events, result subject


def replica(replica_id: str, app: str, version: int, functions: Iterable[Function]) -> dict[str, Any]:
    """A replica of ``app`` serving ``functions``: (name, bound to events, result subject) each."""
    calls = f"$KV.{subjects.CALLS_BUCKET}"
    own = [f"{calls}.{subjects.calls_keys_of_app(kind, app)}" for kind in ("s", "r")]  # its app's statuses, records
    pub = {
        subjects.answers_of_app(app), subjects.replica_status(replica_id), subjects.relay(replica_id),
        subjects.event_replies(app), *own,
        f"$KV.{subjects.RESULTS_BUCKET}.{subjects.check_token(app, 'app')}.>",  # its app's large outputs: write only
    }
    sub = {subjects.replica_invoke(replica_id), subjects.replica_cancel(replica_id),
           subjects.replica_credit(replica_id), subjects.replica_standby(replica_id), f"{replica_inbox(replica_id)}.>"}
    for name, events, result_subject in functions:
        durable = subjects.calls_consumer(app, name)
        streams = [subjects.CALLS_STREAM] + ([subjects.events_stream(app, name)] if events else [])
        consumers = [(stream, durable) for stream in streams]
        consumers.append((subjects.CALLS_STREAM, subjects.pinned_calls_consumer(app, name, version)))  # its own only
        for stream, durable in consumers:
            pub |= {f"{_JS}.CONSUMER.MSG.NEXT.{stream}.{durable}", f"{_JS}.CONSUMER.INFO.{stream}.{durable}",
                    f"$JS.ACK.{stream}.{durable}.>"}
        pub |= {subjects.stats(app, name), subjects.dead(app, name)}
        if result_subject:
            pub.add(result_subject)
        sub.add(subjects.invoke(app, name, version))
    return {**_user(pub, sub), "resp": _ONE_ANSWER}


def node(node_id: str, inbox_prefix: str) -> dict[str, Any]:
    """A node agent: hears the writes of its own assignment (``$KV.ember_assignments.<node id>``, a plain
    subscription: no consumer, no read of another node's key), asks a control plane for what is assigned to it
    (``subjects.node_fetch``: its assignment, its replicas' bundles and volumes, checked by the control plane) and
    for its replicas' secrets, writes its node's info and its own replicas' states (``<node id>.<replica id>``: no
    other node's) and publishes their output lines. No store's content is open to it: no direct get, message get
    or consumer on ``ember_bundles``, ``ember_volumes``, ``ember_volume_chunks`` or ``ember_assignments``, and no
    stream's info but those of the two buckets it writes (their keys, node and replica ids, it hears anyway): the
    info of ``ember_calls`` or an object store would list every app's call ids or every stored object's name."""
    pub = {
        *(f"{_JS}.STREAM.INFO.{_kv(bucket)}" for bucket in (subjects.NODES_BUCKET, subjects.REPLICAS_BUCKET)),
        f"$KV.{subjects.NODES_BUCKET}.{node_id}",
        f"$KV.{subjects.REPLICAS_BUCKET}.{subjects.replica_keys_of_node(node_id)}",
        subjects.node_logs(node_id), subjects.node_secrets(node_id), subjects.node_build_events(node_id),
        subjects.node_fetch(node_id),
    }
    sub = {f"{inbox_prefix}.>", subjects.REPLICA_STATUS_ALL, subjects.node_builds(node_id),
           subjects.assignment_updates(node_id)}
    return _user(pub, sub)
