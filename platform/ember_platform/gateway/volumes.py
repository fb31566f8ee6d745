"""Volume routes: ``PUT /v1/volumes/-/chunks/<sha256>`` and ``POST /v1/volumes/-/chunks/missing`` (uploading chunks,
``deploy``), ``POST /v1/volumes/<name>/versions`` (a new version, ``deploy``), ``GET /v1/volumes[/<name>]``
(``read``) and ``DELETE /v1/volumes/<name>`` (``deploy``).

A token's app patterns cover volume names too: a token for ``team-a-*`` reads and writes the volumes
``team-a-*`` only. A volume it does not see is answered as one that does not exist (404); writing a version under
a name it does not cover is a 403 (whether that volume exists or not).

Chunks are addressed by their content and stored once, but a hash is no proof of ownership: an upload is recorded
for the token's app patterns, a version may name only chunks recorded for a pattern that matches its volume's name,
and "which are missing" answers missing for a chunk stored for other names only (the client then uploads its own
copy, which records its patterns: the bytes are not stored twice). See ``volumes.store``.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ember._errors import ForbiddenError, InvalidInputError
from ember.wire.volumes import MAX_CHUNK_BYTES, MAX_CHUNKS_QUERY, ChunksMissing, ChunksQuery, VolumeCommit
from ember.wire.volumes import name_problem as volume_name_problem
from ember_platform.control.owners import patterns_of, upload_target
from ember_platform.gateway.body import decode_json, read_body
from ember_platform.gateway.guard import principal_of
from ember_platform.gateway.responses import json_response, platform_of
from ember_platform.volumes.checks import check_sha
from ember_platform.volumes.store import no_such_volume

_commit_decoder = msgspec.json.Decoder(VolumeCommit)
_query_decoder = msgspec.json.Decoder(ChunksQuery)


def _name(request: Request) -> str:
    name: str = request.path_params["volume"]
    problem = volume_name_problem(name)
    if problem:
        raise InvalidInputError(problem, field="volume")
    return name


def _max_chunk(request: Request) -> int:
    return min(platform_of(request).settings.max_volume_chunk_bytes, MAX_CHUNK_BYTES)


async def put_chunk(request: Request) -> Response:
    sha = check_sha(request.path_params["sha256"], "sha256")
    data = await read_body(request, _max_chunk(request))
    principal, volume = principal_of(request), request.query_params.get("volume")
    target = upload_target(principal, volume, volume_name_problem(volume) if volume is not None else None, "volume")
    created = await platform_of(request).volumes.put_chunk(sha, data, patterns_of(principal, target))
    return json_response({"sha256": sha, "size": len(data), "created": created}, 201 if created else 200)


async def missing_chunks(request: Request) -> Response:
    query = decode_json(_query_decoder, await read_body(request, 80 * MAX_CHUNKS_QUERY))
    if len(query.chunks) > MAX_CHUNKS_QUERY:
        raise InvalidInputError(f"at most {MAX_CHUNKS_QUERY} chunks per question", field="$.chunks")
    for i, sha in enumerate(query.chunks):
        check_sha(sha, f"$.chunks[{i}]")
    missing = await platform_of(request).volumes.missing(query.chunks, principal_of(request))
    return json_response(ChunksMissing(missing=missing))


async def commit_version(request: Request) -> Response:
    platform = platform_of(request)
    name = _name(request)
    if not principal_of(request).sees(name):
        raise ForbiddenError(f"this token's app patterns do not cover the volume name {name!r}", field="volume")
    req = decode_json(_commit_decoder, await read_body(request, platform.settings.max_volume_commit_bytes))
    await platform.volumes.commit(name, req.files, _max_chunk(request), any_chunk=principal_of(request).all_apps)
    return json_response(platform.volumes.view(name, platform.registry.deployments.items.values(),
                                               sees=principal_of(request).sees), 201)


async def list_volumes(request: Request) -> Response:
    platform = platform_of(request)
    principal = principal_of(request)
    deployments = list(platform.registry.deployments.items.values())
    return json_response([platform.volumes.view(n, deployments, sees=principal.sees) for n in platform.volumes.names()
                          if principal.sees(n)])


async def get_volume(request: Request) -> Response:
    platform = platform_of(request)
    name = _name(request)
    principal = principal_of(request)
    if not principal.sees(name):
        raise no_such_volume(name)
    return json_response(platform.volumes.view(name, platform.registry.deployments.items.values(), detail=True,
                                               sees=principal.sees))


async def delete_volume(request: Request) -> Response:
    platform = platform_of(request)
    name = _name(request)
    principal = principal_of(request)
    if not principal.sees(name):
        raise no_such_volume(name)
    await platform.volumes.remove(name, platform.registry.deployments.items.values(), principal.sees)
    return Response(status_code=204)
