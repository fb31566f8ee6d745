"""``ember push`` of an app with an image: its images are locked and built on the platform, and its manifest is read
there by importing it inside its image (``POST /v1/apps/<app>/builds``), so that the pushing machine needs none
of the image's packages."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import msgspec

from ember._client import Transport
from ember._errors import InvalidSpecError, UnavailableError
from ember._plan import ImagePlan
from ember.wire import Manifest, encoder
from ember.wire.builds import BuildStart
from ember.wire.images import BuildView

Say = Callable[[str], None]
POLL_S = 0.25
INSPECT_TIMEOUT_S = 300.0


def plan_images(path: str | Path, app_name: str | None = None) -> ImagePlan:
    """Import the app file in a fresh interpreter, the packages this machine lacks stood in for: its images, and
    its manifest when nothing was missing."""
    cmd = [sys.executable, "-m", "ember._inspect", "--images", str(path), *([app_name] if app_name else [])]
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=INSPECT_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        raise InvalidSpecError(f"importing {path} took over {INSPECT_TIMEOUT_S:.0f}s: does its top level wait on "
                               "something (a download, a server, input)? Move that into a setup hook") from exc
    if proc.returncode != 0:
        raise InvalidSpecError(f"importing {path} failed:\n{proc.stderr.decode(errors='replace').strip()}")
    try:
        found = msgspec.json.decode(proc.stdout, type=ImagePlan)
    except msgspec.DecodeError as exc:
        raise InvalidSpecError(f"importing {path} printed no plan that Ember could read ({exc}); its output:\n"
                               f"{proc.stdout.decode(errors='replace').strip()[-2000:]}") from exc
    if not found.images and found.manifest is None:
        raise InvalidSpecError(
            f"importing {path} needs {', '.join(found.missing)}, which this machine does not have and the app has "
            f"no image to install: add it to an image (`ember.App(..., image=ember.Image().pip_install("
            f"{found.missing[0]!r}))`) or install it here")
    return found


def build_images(transport: Transport, found: ImagePlan, bundle_sha256: str, say: Say,
                 timeout_s: float = 1800.0, relock: bool = False) -> Manifest:
    """Have the platform lock and build the app's images and read its manifest inside them; its log is passed to
    ``say`` line by line. ``InvalidSpecError`` with the platform's reason (uv's, naming the package) if it fails.
    An image the running version has locked is kept as it is, unless ``relock``."""
    body = encoder.encode(BuildStart(bundle_sha256=bundle_sha256, module=found.module, images=found.images,
                                     inspect_in=found.inspect_in, relock=relock, declared=found.declared))
    view = msgspec.json.decode(transport.request("POST", f"/v1/apps/{found.app}/builds", content=body,
                                                 headers={"content-type": "application/json"}).content, type=BuildView)
    say(f"building {len(found.images)} image(s) on node {view.node_id} (build {view.build_id[:8]})")
    deadline = time.monotonic() + timeout_s
    since = 0
    while True:
        view = msgspec.json.decode(
            transport.request("GET", f"/v1/apps/{found.app}/builds/{view.build_id}?since={since}").content,
            type=BuildView)
        for line in view.lines:
            say(f"  | {line}")
        since = view.next_line
        if view.state == "failed":
            raise InvalidSpecError(f"the image of {found.app} could not be built: {view.error}")
        if view.state == "ready" and view.manifest_json:
            return msgspec.json.decode(view.manifest_json, type=Manifest)
        if time.monotonic() > deadline:
            raise UnavailableError(f"the image build of {found.app} did not finish in {timeout_s:.0f}s",
                                   retry_after_s=5.0)
        time.sleep(POLL_S)
