"""A hostile app for the NATS attack tests: its function finds its replica's own NATS connection (as any code in a
replica can) and tries what a replica must not do. Each attempt reports the error the server answered with."""

import ember

app = ember.App("intruder")


@app.function(timeout_s=120)
def attack(target: str) -> dict:
    import asyncio
    import gc

    from nats.aio.client import Client

    gc.unfreeze()  # the replica froze what its start made (its connection too); any code may thaw it to look
    nc = next(o for o in gc.get_objects() if isinstance(o, Client) and o.is_connected)
    loop = next(o for o in gc.get_objects() if isinstance(o, asyncio.AbstractEventLoop) and o.is_running())
    forged = b'{"replica_id":"%s-forged","stream":"stdout","line":"FORGED LINE","ts":1.0}' % target.encode()

    async def attempts() -> dict:
        seen = {}

        async def attempt(name, action):
            nc._err = None  # the server's answer to this attempt, if it sends one, lands here
            try:
                await action()
                await nc.flush(timeout=5)
                await asyncio.sleep(0.3)
                seen[name] = repr(nc.last_error) if nc.last_error else "no error"
            except Exception as exc:  # a request that got no answer: the server dropped it
                seen[name] = f"{type(exc).__name__}: {exc}; {nc.last_error!r}"

        async def request(subject, payload=b""):
            await nc.request(subject, payload, timeout=2)

        async def subscribe(subject):
            await nc.subscribe(subject)

        await attempt("subscribe to another app's calls", lambda: subscribe(f"ember.invoke.default.{target}.greet.v1"))
        await attempt("subscribe to every call", lambda: subscribe("ember.>"))
        await attempt("read a deployment", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_deployments.$KV.ember_deployments.{target}"))
        await attempt("watch the tokens", lambda: request("$JS.API.CONSUMER.CREATE.KV_ember_tokens", b"{}"))
        await attempt("register a fake replica", lambda: nc.publish("$KV.ember_replicas.forged-replica", b"{}"))
        await attempt("write an assignment", lambda: nc.publish("$KV.ember_assignments.some-node", b"{}"))
        await attempt("answer another app's call", lambda: nc.publish(f"_EMBER.answers.gw.{target}.frame", b"[]"))
        await attempt("log as another app", lambda: nc.publish(f"ember.logs.{target}.default", forged))
        await attempt("report as another replica", lambda: nc.publish("ember.replica.someone-else.status", b"{}"))
        await attempt("purge the call queue", lambda: request("$JS.API.STREAM.PURGE.EMBER_CALLS", b"{}"))
        node = str(nc.options.get("user") or "replica.x.y").split(".")[1]  # its own node, as its user says
        await attempt("ask for its node's secrets", lambda: request(
            f"ember.node.{node}.secrets", b'{"replica_id":"%s"}' % target.encode()))
        await attempt("read a secret", lambda: request(
            f"$JS.API.DIRECT.GET.KV_ember_secrets.$KV.ember_secrets.{target}"))
        return seen

    return asyncio.run_coroutine_threadsafe(attempts(), loop).result(120)
