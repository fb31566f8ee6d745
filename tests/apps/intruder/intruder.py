"""A hostile app for the NATS attack tests: its function finds its replica's own NATS connection (as any code in a
replica can) and tries what a replica must not do. Each attempt reports the error the server answered with."""

import ember

app = ember.App("intruder")


async def refusable(nc, subject, payload=b""):
    """A request's answer; or, as soon as the server says it refused it (its permissions violation, which comes
    before any answer could), an error naming that: a refused request is not waited for until its timeout."""
    import asyncio

    asked = asyncio.ensure_future(nc.request(subject, payload, timeout=2))
    while not asked.done() and not nc.last_error:
        await asyncio.sleep(0.01)
    if not asked.done():
        asked.cancel()
        raise RuntimeError(f"refused before any answer; {nc.last_error!r}")
    return (await asked).data


class Attempts:
    """This replica's own NATS connection, found as any code in a replica can find it, and what each attempt made
    of it: the error the server answered with, or "no error: <its answer>"."""

    def __init__(self):
        import asyncio
        import gc

        from nats.aio.client import Client

        gc.unfreeze()  # the replica froze what its start made (its connection too); any code may thaw it to look
        self.nc = next(o for o in gc.get_objects() if isinstance(o, Client) and o.is_connected)
        self.loop = next(o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running())
        self.seen = {}

    def run(self, attempts) -> dict:
        """Run ``attempts()`` (a coroutine function calling ``attempt``) on the replica's own loop."""
        import asyncio

        asyncio.run_coroutine_threadsafe(attempts(), self.loop).result(120)
        return self.seen

    async def attempt(self, name, action):
        import asyncio

        nc = self.nc
        nc._err = None  # the server's answer to this attempt, if it sends one, lands here
        try:
            answer = await action()
            await nc.flush(timeout=5)
            await asyncio.sleep(0.3)
            self.seen[name] = repr(nc.last_error) if nc.last_error else f"no error: {answer!r}"[:300]
        except Exception as exc:  # a request that got no answer: the server dropped it
            self.seen[name] = f"{type(exc).__name__}: {exc}; {nc.last_error!r}"

    async def request(self, subject, payload=b""):
        return await refusable(self.nc, subject, payload)

    async def publish(self, subject, payload=b""):
        await self.nc.publish(subject, payload)

    async def subscribe(self, subject):
        await self.nc.subscribe(subject)


@app.function(timeout_s=120)
def attack(target: str) -> dict:
    probe = Attempts()
    forged = b'{"replica_id":"%s-forged","stream":"stdout","line":"FORGED LINE","ts":1.0}' % target.encode()

    async def attempts() -> None:
        attempt, request, publish, subscribe = probe.attempt, probe.request, probe.publish, probe.subscribe
        await attempt("subscribe to another app's calls", lambda: subscribe(f"ember.invoke.default.{target}.greet.v1"))
        await attempt("subscribe to every call", lambda: subscribe("ember.>"))
        await attempt("read a deployment", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_deployments.$KV.ember_deployments.{target}"))
        await attempt("watch the tokens", lambda: request("$JS.API.CONSUMER.CREATE.KV_ember_tokens", b"{}"))
        await attempt("register a fake replica", lambda: publish("$KV.ember_replicas.forged-replica", b"{}"))
        await attempt("write an assignment", lambda: publish("$KV.ember_assignments.some-node", b"{}"))
        await attempt("answer another app's call", lambda: publish(f"_EMBER.answers.gw.{target}.frame", b"[]"))
        await attempt("send a bundle to another app's streams", lambda: publish(
            f"_EMBER.answers.gw.{target}.bundle", b'[["0123456789abcdef"],[["c",0,[],"",true,null]]]'))
        await attempt("log as another app", lambda: publish(f"ember.logs.{target}.default", forged))
        await attempt("report as another replica", lambda: publish("ember.replica.someone-else.status", b"{}"))
        await attempt("purge the call queue", lambda: request("$JS.API.STREAM.PURGE.EMBER_CALLS", b"{}"))
        node = str(probe.nc.options.get("user") or "replica.x.y").split(".")[1]  # its own node, as its user says
        await attempt("ask for its node's secrets", lambda: request(
            f"ember.node.{node}.secrets", b'{"replica_id":"%s"}' % target.encode()))
        await attempt("read a secret", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_secrets.$KV.ember_secrets.{target}"))

    return probe.run(attempts)


@app.function(timeout_s=120)
def steal(victim: dict) -> dict:
    """From this replica's own connection, everything another app's calls must be safe from: listing, reading and
    forging its records and results, and the shared streams' indexes. ``victim``: {"app": ..., "call_id": ...}."""
    import json

    probe = Attempts()
    target, call_id = victim["app"], victim["call_id"]
    replica, node = victim.get("replica_id", "r0"), victim.get("node_id", "n0")
    forged = json.dumps({"call_id": call_id, "app": target, "function": "greet", "status": "succeeded",
                         "output": "FORGED", "created_at": 1.0, "updated_at": 1.0}).encode()
    calls = "$KV.ember_calls"

    async def attempts() -> None:
        attempt, request, publish = probe.attempt, probe.request, probe.publish
        await attempt("list every app's calls", lambda: request(
            "$JS.API.STREAM.INFO.KV_ember_calls", b'{"subjects_filter": ">"}'))
        await attempt("read a record by sequence", lambda: request(
            "$JS.API.STREAM.MSG.GET.KV_ember_calls", b'{"seq": 1}'))
        await attempt("read another app's record", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_calls.{calls}.r.{target}.{call_id}"))
        await attempt("find a record under any app", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_calls.{calls}.r.*.{call_id}"))
        await attempt("read a record by its last subject", lambda: request(
            "$JS.API.DIRECT.GET.KV_ember_calls", b'{"last_by_subj": "%s.r.%s.%s"}' % (
                calls.encode(), target.encode(), call_id.encode())))
        await attempt("forge another app's result", lambda: publish(f"{calls}.r.{target}.{call_id}", forged))
        await attempt("forge another app's status", lambda: publish(f"{calls}.s.{target}.{call_id}", forged))
        await attempt("write another app's large output", lambda: publish(
            f"$KV.ember_results.{target}.{call_id}.x.0", b"FORGED"))
        await attempt("read the large outputs", lambda: request(
            "$JS.API.STREAM.MSG.GET.KV_ember_results", b'{"seq": 1}'))
        await attempt("list the stored chunks", lambda: request(
            "$JS.API.STREAM.INFO.OBJ_ember_volume_chunks", b'{"subjects_filter": ">"}'))
        await attempt("list the streams", lambda: request("$JS.API.STREAM.NAMES", b"{}"))
        await attempt("delete a dead letter", lambda: request("$JS.API.STREAM.MSG.DELETE.EMBER_DEAD", b'{"seq": 1}'))
        await attempt("publish into another client's inbox", lambda: publish("_INBOX.someone.x", b"FORGED"))
        await attempt("reply to another app's event requester", lambda: publish(
            f"_EMBER.replies.{target}.x", b"FORGED"))
        await attempt("put another app's replica on standby", lambda: publish(
            f"ember.replica.{replica}.standby", b"{}"))
        await attempt("ask for a bundle as its node does", lambda: request(
            f"ember.node.{node}.fetch", b'{"kind": "bundle", "name": "x"}'))
        # Its own app's keys it may write (its replicas keep their calls' records there): even one that names the
        # victim's call in its body changes nothing of the victim's.
        await attempt("write under its own app", lambda: publish(f"{calls}.r.intruder.{call_id}", forged))

    return probe.run(attempts)


@app.function(timeout_s=60)
def credentials() -> dict:
    """Hands out this replica's own NATS user and password, as its code finds them on its connection: what a
    tenant could give to a process outside the platform to keep a connection once the replica is gone."""
    import gc

    from nats.aio.client import Client

    gc.unfreeze()
    nc = next(o for o in gc.get_objects() if isinstance(o, Client) and not o.is_closed)  # maybe renewing just now
    return {"user": nc.options["user"], "password": nc.options["password"],
            "inbox_prefix": bytes(nc._inbox_prefix).decode(), "reconnects": nc.stats["reconnects"]}


@app.function(timeout_s=120)
def meddle(victim: dict) -> dict:
    """From this replica's own connection: read, watch and write another app's schedule state (KV ember_schedules,
    the control planes' alone), cancel another app's call (``ember.control.cancelled``, the control planes'
    relay subject, and the replica's cancel subject), and wake or watch other apps' functions
    (``ember.control.unserved``, the control planes' alone). ``victim``: {"app", "function", "call_id", "replica"}."""
    probe = Attempts()
    key = f"{victim['app']}.{victim['function']}"
    forged = b'{"last_tick":1.0,"paused":true}'

    async def attempts() -> None:
        attempt, request, publish = probe.attempt, probe.request, probe.publish
        await attempt("read a schedule", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_schedules.$KV.ember_schedules.{key}"))
        await attempt("read a schedule by sequence", lambda: request(
            "$JS.API.STREAM.MSG.GET.KV_ember_schedules", b'{"seq": 1}'))
        await attempt("list the schedules", lambda: request("$JS.API.STREAM.INFO.KV_ember_schedules"))
        await attempt("watch the schedules", lambda: request("$JS.API.CONSUMER.CREATE.KV_ember_schedules", b"{}"))
        await attempt("write a schedule", lambda: publish(f"$KV.ember_schedules.{key}", forged))
        await attempt("purge the schedules", lambda: request("$JS.API.STREAM.PURGE.KV_ember_schedules", b"{}"))
        await attempt("say a call was cancelled", lambda: publish(
            "ember.control.cancelled", f"{victim['app']} {victim['call_id']}".encode()))
        await attempt("cancel at its replica", lambda: publish(
            f"ember.replica.{victim['replica']}.cancel", victim["call_id"].encode()))
        await attempt("wake another app's function", lambda: publish(
            "ember.control.unserved", f"intruder {victim['app']} {victim['function']}".encode()))
        await attempt("hear which functions are woken", lambda: probe.subscribe("ember.control.unserved"))

    return probe.run(attempts)


@app.function(timeout_s=120)
def claim_model(victim: dict) -> dict:
    """From this replica's own connection: read, watch and write the claim of a served model name (KV ember_models,
    the control planes' alone). ``victim``: {"key": the name's key}."""
    probe = Attempts()
    key = victim["key"]
    forged = b'{"model":"echo-words","app":"intruder","claimed_at":1.0}'

    async def attempts() -> None:
        attempt, request, publish = probe.attempt, probe.request, probe.publish
        await attempt("read a claim", lambda: request(f"$JS.API.DIRECT.GET.KV_ember_models.$KV.ember_models.{key}"))
        await attempt("read a claim by sequence", lambda: request(
            "$JS.API.STREAM.MSG.GET.KV_ember_models", b'{"seq": 1}'))
        await attempt("list the claims", lambda: request("$JS.API.STREAM.INFO.KV_ember_models"))
        await attempt("watch the claims", lambda: request("$JS.API.CONSUMER.CREATE.KV_ember_models", b"{}"))
        await attempt("write a claim", lambda: publish(f"$KV.ember_models.{key}", forged))
        await attempt("purge the claims", lambda: request("$JS.API.STREAM.PURGE.KV_ember_models", b"{}"))

    return probe.run(attempts)


@app.function(timeout_s=120)
def steer(victim: dict) -> dict:
    """From this replica's own connection: have the server or a control plane write where the replica may not,
    through the reply subject of a request it may make (NATS checks no permission on a reply subject), and purge the
    buckets it writes with a rollup header. ``victim``: {"app": another app, "token": {"id", "secret_sha256"}: a token
    record to plant with admin scope}."""
    import asyncio
    import json
    import time

    probe = Attempts()
    nc = probe.nc
    own = str(nc.options["user"]).split(".")[2]  # replica.<node id>.<replica id>
    token_id = victim["token"]["id"]
    record = json.dumps({"info": {"id": token_id, "name": "planted", "scopes": ["admin"], "apps": ["*"],
                                  "created_at": time.time()},
                         "secret_sha256": victim["token"]["secret_sha256"]}).encode()
    calls = "$KV.ember_calls"

    async def attempts() -> None:
        attempt, publish = probe.attempt, probe.publish
        await attempt("write a token record under its own key", lambda: publish(f"{calls}.s.intruder.{token_id}",
                                                                                  record))
        await attempt("read it back into the tokens", lambda: nc.publish(
            f"$JS.API.DIRECT.GET.KV_ember_calls.{calls}.s.intruder.{token_id}", b"",
            reply=f"$KV.ember_tokens.{token_id}"))
        deployment = f"$KV.ember_deployments.{victim['app']}"
        await attempt("have the relay answer into another app's deployment", lambda: nc.publish(
            f"ember.relay.{own}", b'{"type": "record", "call_id": "x"}', reply=deployment))
        await attempt("purge every app's call records", lambda: nc.publish(
            f"{calls}.s.intruder.rollup", b"{}", headers={"Nats-Rollup": "all"}))
        await attempt("purge every app's large outputs", lambda: nc.publish(
            "$KV.ember_results.intruder.rollup.x.0", b"x", headers={"Nats-Rollup": "all"}))

    seen = probe.run(attempts)
    if victim.get("call_id"):  # the relay's reads and takes, asked for another app's call: its own app's keys only
        # A record of its own key that names the victim's call: a take must not write it under the victim's key.
        plant = f"planted{int(time.time() * 1e6)}"
        named = json.dumps({"call_id": victim["call_id"], "app": victim["app"], "function": "greet",
                            "status": "queued", "created_at": time.time(), "updated_at": time.time()}).encode()
        asyncio.run_coroutine_threadsafe(probe.publish(f"{calls}.s.intruder.{plant}", named), probe.loop).result(30)
        relayed = {"read another app's call over the relay": {"type": "read", "call_id": victim["call_id"],
                                                               "kind": "r"},
                   "take another app's call over the relay": {"type": "take", "call_id": victim["call_id"],
                                                               "function": "greet", "attempt": 1},
                   "read its own key naming another app's call": {"type": "read", "call_id": plant, "kind": "s"},
                   "take its own key naming another app's call": {"type": "take", "call_id": plant,
                                                                  "function": "greet", "attempt": 1}}
        for name, body in relayed.items():
            async def ask(body=body):
                return (await nc.request(f"ember.relay.{own}", json.dumps(body).encode(), timeout=10)).data
            seen[name] = asyncio.run_coroutine_threadsafe(ask(), probe.loop).result(30).decode()
    for name, target in (("call an app that does not exist", "no-such-app"), ("call another app's missing function",
                                                                                victim["app"])):
        try:
            ember.lookup(target, "nothing-here").remote(1)
            seen[name] = "no error"
        except ember.EmberError as exc:
            seen[name] = f"{type(exc).__name__}: {exc}".replace(target, "<app>")
    return seen


@app.function(timeout_s=120)
def spoil(victim: dict) -> dict:
    """From this replica's own connection: a pull on its own (empty) queue that names another app's deployment and
    its node's assignment as the reply subject, where the server answers "no messages" (an empty message). Allowed:
    the pull is its own; what the platform makes of the answers is the point. ``victim``: {"app": another app}."""
    from ember.wire import subjects

    probe = Attempts()
    nc = probe.nc
    node = str(nc.options["user"]).split(".")[1]  # replica.<node id>.<replica id>
    pull = f"$JS.API.CONSUMER.MSG.NEXT.{subjects.CALLS_STREAM}.{subjects.calls_consumer('intruder', 'spoil')}"

    async def attempts() -> None:
        for name, reply in (("answer into another app's deployment", f"$KV.ember_deployments.{victim['app']}"),
                            ("answer into its node's assignment", f"$KV.ember_assignments.{node}")):
            await probe.attempt(name, lambda reply=reply: nc.publish(pull, b'{"batch": 1, "no_wait": true}',
                                                                     reply=reply))

    return probe.run(attempts)


@app.function(schedule=ember.Period(seconds=3600))
def hourly() -> None:
    """A schedule of its own: the schedule loop watches this app's final records too."""


@app.function(timeout_s=120)
def forge_ended(victim: dict) -> dict:
    """From this replica's own connection: a final record's message under its own app's key (which it may write)
    naming another app's call, as the schedule loop's watch of final records sees one. ``victim``: {"call_id"}."""
    probe = Attempts()

    async def attempts() -> None:
        await probe.attempt("say another app's call ended", lambda: probe.publish(
            f"$KV.ember_calls.r.intruder.{victim['call_id']}", b"{}"))

    return probe.run(attempts)


@app.function(timeout_s=120)
def spoil_with_acks(targets: list) -> dict:
    """From this replica's own connection: a publish to a key of its own app (JetStream stores it and acknowledges
    it), its reply subject naming another bucket's key (``targets``): NATS checks no permission on a reply subject,
    so the server's acknowledgement is stored under that key."""
    probe = Attempts()

    async def attempts() -> None:
        for target in targets:
            await probe.attempt(f"spoil {target}", lambda t=target: probe.nc.publish(
                "$KV.ember_calls.s.intruder.spoiler", b"{}", reply=t))

    return probe.run(attempts)
