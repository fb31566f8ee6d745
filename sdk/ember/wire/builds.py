"""The body of ``POST /v1/apps/<app>/builds``: kept apart from ``images`` because it holds a whole manifest
(``specs``, which itself holds images' specs)."""

from __future__ import annotations

import msgspec

from ember.wire.images import ImageSpec
from ember.wire.specs import Manifest


class BuildStart(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """``POST /v1/apps/<app>/builds``: lock and build these images for this bundle, and read its manifest."""

    bundle_sha256: str
    module: str
    images: list[ImageSpec]
    inspect_in: int = 0
    relock: bool = False  # resolve every image again, even one the running version has a lock for
    # the manifest as read on the pushing machine, images unlocked: the node's manifest is held to it (required;
    # a default only so that an older client's request is answered with a 422 naming it)
    declared: Manifest | None = None
