"""What the control plane records of stored content, read as it stores it: who uploaded an object
(``ember_owners``), and the object store's own name of its bytes (a new one each time they are written)."""

from __future__ import annotations

import asyncio
import uuid

import httpx

from ember_platform.control.owners import Kind, Owners
from support.auth import bearer
from support.natsconn import connect as admin_connect


def owners_of(url: str, kind: Kind, sha: str) -> list[str]:
    """The app patterns recorded for ``sha`` on the Ember whose NATS is at ``url``."""
    async def read() -> list[str]:
        nc = await admin_connect(url)
        try:
            return await (await Owners.open(nc.jetstream())).patterns(kind, sha)
        finally:
            await nc.close()

    return asyncio.run(read())


def stored_copy(url: str, store: str, sha: str) -> str:
    """The object store's name (its ``nuid``) of the bytes stored as ``sha`` in ``store``: unchanged while they
    are not written again."""
    async def read() -> str:
        nc = await admin_connect(url)
        try:
            return str((await (await nc.jetstream().object_store(store)).get_info(sha)).nuid)
        finally:
            await nc.close()

    return asyncio.run(read())


def deploy_token(http: httpx.Client, apps: list[str]) -> dict[str, str]:
    """The header of a new ``deploy`` token for ``apps``, made with the admin client ``http``."""
    made = http.post("/v1/tokens", json={"scopes": ["deploy"], "apps": apps, "name": f"owners-{uuid.uuid4().hex[:8]}"})
    assert made.status_code == 201, made.text
    return bearer(made.json()["token"])
