"""What a node may change in an app's manifest when it builds the app's images, and nothing more.

A build's manifest is read by the node, inside the app's image, and would be deployed as the node returns it; a node
(or anything holding a node's NATS credentials) is no tenant's delegate, so the platform holds the node's answer to
the manifest the pushing machine read itself (``BuildStart.declared``, images unlocked). The node may only:

- lock each image: the lock and its hash filled in, for the same declaration (packages, indexes, Python version,
  which the node fills in where none was named) and the same environment variables; every package declared
  without a marker is pinned in the lock;
- read what the pushing machine may have read differently, since it imported the app with the image's packages
  stood in for or at other versions: each function's input mode, parameters, schemas and tensor signature, and the
  Python and SDK versions the manifest was read with.

Anything else (the app, its services and functions, their secrets, volumes, GPUs, events, scaling bounds and every
field added later) differing fails the build, naming the first field that differs.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ember._errors import InvalidInputError
from ember.wire import Manifest
from ember.wire.images import PACKAGE_SPEC, ImageSpec, image_problems, lock_pins
from ember.wire.validate import manifest_problems

REFINED_APP_FIELDS = frozenset({"python", "sdk_version"})  # the interpreter the manifest was read with
# what a function's signature says through its types, which only the image may have (or have at its own version)
REFINED_FUNCTION_FIELDS = frozenset({"input_mode", "params", "input_schema", "output_schema", "tensors"})


def check_declared(declared: Manifest | None, app: str, module: str) -> None:
    """The manifest a build request declares is the app's, read from the same module, and not locked yet: 422
    naming the field otherwise (``$.declared`` when there is none: without it the node's answer is unverifiable)."""
    if declared is None:
        raise InvalidInputError("a build declares the app's manifest as read on the pushing machine, its images "
                                "unlocked (ember push sends it): the node's answer is checked against it",
                                field="$.declared")
    if declared.app != app:
        raise InvalidInputError(f"the declared manifest is app {declared.app[:80]!r}'s, not {app!r}'s",
                                field="$.declared.app")
    if declared.module != module:
        raise InvalidInputError("the declared manifest is read from another module than the one to build",
                                field="$.declared.module")
    for field, problem in manifest_problems(declared, "$.declared"):
        raise InvalidInputError(problem, field=field)
    for i, service in enumerate(declared.services):
        if service.image is not None and (service.image.lock or service.image.sha256):
            raise InvalidInputError("an image to build is declared, not locked: the platform locks it",
                                    field=f"$.declared.services[{i}].image.lock")


def manifest_difference(declared: Manifest, returned: Manifest) -> str | None:
    """The JSON path of the first difference between the declared manifest and a build's that a build may not
    make; None when the build only made the changes it may."""
    found = _first_difference(_comparable(declared), _comparable(returned), "$")
    if found is not None:
        return found
    for i, (mine, theirs) in enumerate(zip(declared.services, returned.services, strict=True)):
        found = _image_difference(mine.image, theirs.image, f"$.services[{i}].image")
        if found is not None:
            return found
    return None


def _comparable(manifest: Manifest) -> dict[str, Any]:
    """The manifest as plain data, without what a build may refine (images are compared on their own)."""
    data: dict[str, Any] = msgspec.to_builtins(manifest)
    for name in REFINED_APP_FIELDS:
        data.pop(name, None)
    for service in data.get("services", []):
        service.pop("image", None)
        for function in service.get("functions", []):
            for name in REFINED_FUNCTION_FIELDS:
                function.pop(name, None)
    return data


def _first_difference(mine: Any, theirs: Any, at: str) -> str | None:
    """The path of the first place ``theirs`` differs from ``mine`` (a list of plain values as one field)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        for key in [*mine, *(k for k in theirs if k not in mine)]:
            if key not in mine or key not in theirs:
                return f"{at}.{key}"
            found = _first_difference(mine[key], theirs[key], f"{at}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs) \
            and all(isinstance(item, dict) for item in [*mine, *theirs]):
        for i, (a, b) in enumerate(zip(mine, theirs, strict=True)):
            found = _first_difference(a, b, f"{at}[{i}]")
            if found is not None:
                return found
        return None
    return None if type(mine) is type(theirs) and mine == theirs else at


def _image_difference(mine: ImageSpec | None, theirs: ImageSpec | None, at: str) -> str | None:
    """Where a returned image is not a lock of the declared one (with its variables, its packages pinned)."""
    if mine is None or theirs is None:
        return None if mine is theirs else at
    if not theirs.locked:
        return f"{at}.lock"
    declared = mine.declared()
    if not declared.python:
        declared = msgspec.structs.replace(declared, python=theirs.python)
    found = _first_difference(msgspec.to_builtins(declared), msgspec.to_builtins(theirs.declared()), at)
    if found is not None:
        return found
    if theirs.env != mine.env:
        return f"{at}.env"
    for path, _problem in image_problems(theirs, at):
        return path
    pins = lock_pins(theirs.lock)
    for spec in mine.packages:
        match = PACKAGE_SPEC.fullmatch(spec.strip())
        if match is not None and ";" not in spec and _normal(match["name"]) not in pins:
            return f"{at}.lock"
    return None


def _normal(name: str) -> str:
    """A distribution name as ``lock_pins`` keys it."""
    return next(iter(lock_pins(f"{name}==0")))
