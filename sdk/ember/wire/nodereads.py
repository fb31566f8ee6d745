"""What a node agent reads through a control plane (``subjects.node_fetch``): never the stores themselves.

A node may read the assignment of its own node and the bundles, volume versions and volume chunks that its
replicas, zygotes or builds need; a control plane checks that before answering, and answers "not found" for
anything else, whether it exists or not. Content is answered in pieces under NATS' max payload: a request per
piece, by offset; every answer says the whole size (``SIZE_HEADER``), so that the node asks for the rest at once,
several pieces in flight. The node still checks what it gets (bundles and chunks by their sha256).
"""

from __future__ import annotations

from typing import Literal

import msgspec

FetchKind = Literal["assignment", "bundle", "volume", "chunk"]
SIZE_HEADER = "Ember-Size"  # the whole content's size in bytes, on every answer
ERROR_HEADER = "Ember-Error"  # why nothing was answered: always NOT_FOUND for what the node may not read
NOT_FOUND = "not found"
UNAVAILABLE = "unavailable"  # the stores did not answer the control plane now: ask again (what the node has stays)


class FetchRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One piece of what a node reads: ``name`` is a bundle's or a chunk's sha256, a volume version's key
    (``<volume>.<version>``), or empty for the node's own assignment; ``offset`` where the piece starts."""

    kind: FetchKind
    name: str = ""
    offset: int = 0
    grant: str = ""  # a bundle being built on this node: the grant the build request carried
