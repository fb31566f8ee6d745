"""What ``ember push`` learns of an app on a machine that may lack its image's packages (``ember._lenient``)."""

from __future__ import annotations

from pathlib import Path

import msgspec

from ember._errors import InvalidSpecError
from ember._lenient import import_standing_in, stand_ins
from ember._loader import find_app
from ember.wire import Manifest
from ember.wire.images import ImageSpec


class ImagePlan(msgspec.Struct, frozen=True, kw_only=True):
    """What ``ember push`` learns of an app without its packages: its name, its images, and what was missing."""

    app: str
    module: str
    images: list[ImageSpec]  # each distinct image once
    inspect_in: int = 0  # the image the manifest is read in: the app's own, else the first
    missing: list[str] = []  # top-level packages this machine lacks that the app's files import, stood in for
    manifest: Manifest | None = None  # when nothing was missing: the manifest, read here
    # the manifest read here even with stand-ins, images unlocked: a build's manifest is held to it
    declared: Manifest | None = None


def plan(argv: list[str]) -> ImagePlan:
    """Import the app as written; stand in for a package this machine lacks only where the app has an image that
    may provide it (an app without one could not run anywhere, and says which package it needs)."""
    path = Path(argv[0])
    with stand_ins(path.resolve().parent) as missing:
        module, name = import_standing_in(path, missing)
        app = find_app(module, argv[1] if len(argv) == 2 else None)
        images: list[ImageSpec] = []
        for spec in app.services.values():
            if spec.image is not None and spec.image not in images:
                images.append(spec.image)
        if missing and not images:
            raise InvalidSpecError(
                f"importing {path.name} needs {', '.join(missing)}, which this machine does not have and the app "
                f"has no image to install: add it to an image (`ember.App(..., image=ember.Image().pip_install("
                f"{missing[0]!r}))`) or install it here")
        declared = app.manifest(name)
        manifest = None if missing else declared
    inspect_in = images.index(app.image) if app.image in images else 0
    return ImagePlan(app=app.name, module=name, images=images, inspect_in=inspect_in, missing=list(missing),
                     manifest=manifest, declared=declared)
