"""Images on the wire: what an app's ``ember.Image`` declares, the lock the platform makes of it, and the build that
turns it into an environment on a node.

An image is *declared* (packages, index URLs, environment variables, a Python version) by the SDK and *locked*
by a builder on a node (``uv pip compile``): the lock lists every distribution at one version with its hashes, and
``image_hash`` of the locked image names its environment on every node. The environment variables are not part of
the name: they are set when a replica starts, not installed.

Every field is checked here, by the SDK when the image is declared, by the platform on every deployment and by a
node before it builds anything: a package spec is a name with extras and a version constraint, never a URL or a
path; an index is an ``https://`` (or ``http://``) URL; a local folder of wheels (``find_links``) is allowed only
where the node's operator allows it (``EMBER_IMAGE_LOCAL_INDEXES``).
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress
import re
from collections.abc import Iterator
from typing import Literal
from urllib.parse import urlsplit

import msgspec

MAX_PACKAGES = 500
MAX_SPEC_LENGTH = 200
MAX_ENV = 100
MAX_ENV_VALUE = 4096
MAX_INDEXES = 8
MAX_URL = 1000
METADATA_HOSTS = frozenset({"metadata.google.internal", "metadata", "instance-data", "instance-data.ec2.internal",
                            "100.100.100.200", "168.63.129.16", "fd00:ec2::254"})
MAX_LOCK_BYTES = 256 * 1024
MAX_LOG_LINE = 2000

# A requirement: a distribution name, optional extras, optional version constraints and an optional marker.
# No URL (``name @ https://...``), no path, no option (``-e``, ``--index-url``): where a package comes from is
# the image's indexes, not its specs.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_VERSION = r"[A-Za-z0-9.*+!_-]+"
_CONSTRAINT = rf"(?:===|==|!=|~=|<=|>=|<|>)\s*{_VERSION}"
PACKAGE_SPEC = re.compile(
    rf"(?P<name>{_NAME})\s*(?:\[\s*{_NAME}(?:\s*,\s*{_NAME})*\s*\])?"
    rf"\s*(?:\(?\s*{_CONSTRAINT}(?:\s*,\s*{_CONSTRAINT})*\s*\)?)?"
    r"\s*(?:;\s*[A-Za-z0-9_ .'\"<>=!~()-]+)?")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
PYTHON_VERSION = re.compile(r"3\.(?:[89]|1[0-9])")
SHA256 = re.compile(r"[0-9a-f]{64}")
BUILD_ID = re.compile(r"[0-9a-f]{32}")
# Names that look like credentials: they belong in a secret (``secrets=``), which is encrypted and never shown.
SECRET_LIKE = re.compile(r"(?i)(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|CREDENTIAL)")
# What an image may not set: what the runtime itself sets, and what would change how Python or the loader start.
RESERVED_ENV = frozenset({"PATH", "HOME", "TMPDIR", "PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE",
                          "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONINSPECT", "LD_PRELOAD", "LD_LIBRARY_PATH",
                          "LD_AUDIT", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"})
RESERVED_ENV_PREFIXES = ("EMBER_", "UV_", "PIP_")
# Distributions Ember itself provides inside every environment (see docs/guides/images.md): an app may not install its
# own copy of them.
EMBER_OWN = frozenset({"ember", "ember-runtime", "ember-platform"})


class ImageSpec(msgspec.Struct, frozen=True, kw_only=True):
    """An image as declared (``lock`` empty) or as locked by a builder (``lock`` and ``sha256`` set)."""

    python: str = ""  # "3.11"; empty: the node's own Python version (the builder writes it into the lock)
    packages: list[str] = []  # requirement specs, in order: pip_install() and requirements() together
    env: dict[str, str] = {}
    index_url: str = ""  # empty: PyPI (or what the node's uv is configured with)
    extra_index_urls: list[str] = []
    find_links: list[str] = []
    no_index: bool = False  # only find_links: no package index at all
    lock: str = ""  # requirements.txt with every distribution pinned (==) and hashed, from ``uv pip compile``
    sha256: str = ""  # image_hash(self): names the environment; set with ``lock``

    @property
    def locked(self) -> bool:
        return bool(self.lock)

    def declared(self) -> ImageSpec:
        """The image as declared: what a builder locks (without lock, hash or environment variables)."""
        return msgspec.structs.replace(self, lock="", sha256="", env={})


def image_hash(image: ImageSpec) -> str:
    """The name of a locked image's environment: a sha256 of everything that decides what gets installed."""
    canonical = msgspec.json.encode({
        "python": image.python, "lock": image.lock, "index_url": image.index_url,
        "extra_index_urls": image.extra_index_urls, "find_links": image.find_links, "no_index": image.no_index})
    return hashlib.sha256(canonical).hexdigest()


def same_declaration(declared: ImageSpec, locked: ImageSpec) -> bool:
    """Whether ``locked`` is a lock of ``declared`` (an image that names no Python version gets the node's)."""
    if not locked.locked:
        return False
    mine = declared.declared()
    if not mine.python:
        mine = msgspec.structs.replace(mine, python=locked.python)
    return mine == locked.declared()


def package_problem(spec: object) -> str | None:
    """Why ``spec`` is not a requirement an image may name (None: it is one)."""
    if not isinstance(spec, str) or not spec.strip():
        return f"{spec!r} is not a package spec: give a name with an optional version, e.g. 'humanize==4.9.0'"
    if len(spec) > MAX_SPEC_LENGTH or not spec.isprintable():
        return f"package spec {spec[:60]!r}...: at most {MAX_SPEC_LENGTH} printable characters"
    text = spec.strip()
    if "://" in text or "@" in text or text.startswith(("-", ".", "/", "~")) or "\\" in text:
        return (f"package spec {text!r}: a name with an optional version ('humanize==4.9.0'), not a URL, a path or "
                "an option; other indexes go in Image(extra_index_urls=[...]) or Image(find_links=[...])")
    match = PACKAGE_SPEC.fullmatch(text)
    if match is None:
        return f"package spec {text!r} is not a requirement pip understands: 'name[extra]>=1.0,<2'"
    if _normal(match["name"]) in EMBER_OWN:
        return f"package spec {text!r}: Ember provides its own runtime inside every image; do not install it"
    return None


def env_problem(name: object, value: object) -> str | None:
    """Why ``name=value`` may not be an image's environment variable (None: it may)."""
    if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
        return (f"environment variable name {str(name)[:60]!r}: letters, digits and '_', not starting with a digit "
                "(no '=', no NUL)")
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        return f"environment variable {name}: set by Ember itself, an image may not set it"
    if SECRET_LIKE.search(name):
        return (f"environment variable {name} looks like a credential: an image's variables are stored and shown "
                f"in plain text; put it in a secret (`ember secret set NAME --apps APP {name}=...`) and name it in "
                "secrets=")
    if not isinstance(value, str):
        return f"environment variable {name}: its value is a string, not {type(value).__name__}"
    if len(value) > MAX_ENV_VALUE or "\x00" in value:
        return f"environment variable {name}: a value of at most {MAX_ENV_VALUE} characters, without NUL"
    return None


def url_problem(url: object, what: str) -> str | None:
    """Why ``url`` may not be a package index (None: it may). Not a cloud's metadata service: a node fetches an index
    from its own network, outside any sandbox, and the build's log is the pusher's."""
    if not isinstance(url, str) or not url.startswith(("https://", "http://")) or len(url) > MAX_URL \
            or not url.isprintable() or any(c in url for c in " \t\"'\\"):
        return f"{what} {str(url)[:80]!r}: an https:// (or http://) URL of at most {MAX_URL} characters"
    try:
        parts = urlsplit(url)
        host = (parts.hostname or "").rstrip(".").lower()
    except ValueError:
        return f"{what} {url[:80]!r}: not a URL"
    if parts.username is not None or parts.password is not None:  # (not quoted back: it holds them)
        return (f"{what}: a URL with credentials (user:password@) is refused, as an image is stored and shown in plain "
                "text; a private index's credentials go on the nodes (a netrc file of the node agent's user, which "
                "uv reads)")
    with contextlib.suppress(ValueError):
        if ipaddress.ip_address(host).is_link_local:
            return f"{what} {url[:80]!r}: a link-local address (a cloud's metadata service) is no package index"
    if host in METADATA_HOSTS:
        return f"{what} {url[:80]!r}: a cloud's metadata service is no package index"
    return None


def find_links_problem(link: object) -> str | None:
    """Why ``link`` may not be a ``find_links`` entry: a URL, or an absolute local folder (that a node accepts only
    where its operator allows local indexes)."""
    if isinstance(link, str) and link.startswith("/"):
        if len(link) > MAX_URL or not link.isprintable() or "\x00" in link or "/../" in f"{link}/" \
                or "/./" in f"{link}/":
            return f"find_links {link[:80]!r}: an absolute, normalised folder path"
        return None
    return url_problem(link, "find_links")


def image_problems(image: ImageSpec, at: str) -> Iterator[tuple[str, str]]:
    """Every problem of an image, each as (JSON path, message)."""
    if image.python and not PYTHON_VERSION.fullmatch(image.python):
        yield f"{at}.python", f"python {image.python!r}: a version such as '3.11' (3.8 to 3.19)"
    if len(image.packages) > MAX_PACKAGES:
        yield f"{at}.packages", f"at most {MAX_PACKAGES} packages"
    for i, spec in enumerate(image.packages[:MAX_PACKAGES]):
        problem = package_problem(spec)
        if problem:
            yield f"{at}.packages[{i}]", problem
    if len(image.env) > MAX_ENV:
        yield f"{at}.env", f"at most {MAX_ENV} environment variables"
    for name, value in list(image.env.items())[:MAX_ENV]:
        problem = env_problem(name, value)
        if problem:
            yield f"{at}.env", problem
    if image.index_url:
        problem = url_problem(image.index_url, "index_url")
        if problem:
            yield f"{at}.index_url", problem
    if len(image.extra_index_urls) > MAX_INDEXES or len(image.find_links) > MAX_INDEXES:
        yield f"{at}.extra_index_urls", f"at most {MAX_INDEXES} extra indexes and {MAX_INDEXES} find_links"
    for i, url in enumerate(image.extra_index_urls[:MAX_INDEXES]):
        problem = url_problem(url, "extra_index_urls")
        if problem:
            yield f"{at}.extra_index_urls[{i}]", problem
    for i, link in enumerate(image.find_links[:MAX_INDEXES]):
        problem = find_links_problem(link)
        if problem:
            yield f"{at}.find_links[{i}]", problem
    if image.no_index and not image.find_links:
        yield f"{at}.no_index", "no_index=True installs only from find_links: give find_links too"
    yield from _lock_problems(image, at)


def _lock_problems(image: ImageSpec, at: str) -> Iterator[tuple[str, str]]:
    if not image.lock and not image.sha256:
        return
    if len(image.lock.encode()) > MAX_LOCK_BYTES or "\x00" in image.lock:
        yield f"{at}.lock", f"a lock of at most {MAX_LOCK_BYTES} bytes"
        return
    for line in _lock_requirements(image.lock):
        if "://" in line or line.startswith(("-", ".", "/")) or "@" in line.split(";")[0]:
            yield f"{at}.lock", f"lock line {line[:80]!r}: only pinned requirements with hashes"
            return
    if not SHA256.fullmatch(image.sha256) or image.sha256 != image_hash(image):
        yield f"{at}.sha256", "not the sha256 of the locked image: push it again to have it locked"


def _lock_requirements(lock: str) -> Iterator[str]:
    """The requirement lines of a lock (comments and hash continuation lines skipped)."""
    for raw in lock.splitlines():
        line = raw.strip().removesuffix("\\").strip()
        if line and not line.startswith(("#", "--hash")):
            yield line


def lock_pins(lock: str) -> dict[str, str]:
    """{normalised distribution name: version} of a lock."""
    pins: dict[str, str] = {}
    for line in _lock_requirements(lock):
        name, sep, version = line.split(";")[0].partition("==")
        if sep:
            pins[_normal(name.split("[")[0])] = version.strip()
    return pins


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


BuildState = Literal["queued", "building", "ready", "failed"]


class BuildRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A control plane asks a node to lock and build an app's images and to read its manifest inside them."""

    build_id: str
    app: str
    bundle_sha256: str
    module: str
    images: list[ImageSpec]  # declared (unlocked), each once
    inspect_in: int = 0  # which of ``images`` the app is imported in to read its manifest
    # per image: the lock the running version has for the same declaration (kept: a push that did not change an
    # image installs what runs now), or an empty ImageSpec (lock it)
    locks: list[ImageSpec] = []
    bundle_grant: str = ""  # lets this node read the bundle from any control plane (``control.node_reads``)


class BuildEvent(msgspec.Struct, frozen=True, kw_only=True):
    """A node's word on a build: log lines while it runs, then its end (``state`` ready or failed)."""

    build_id: str
    lines: list[str] = []
    state: BuildState = "building"
    error: str = ""
    manifest_json: str = ""  # once ready: the manifest read inside the image, its images locked


class BuildView(msgspec.Struct, frozen=True, kw_only=True):
    """``GET /v1/apps/<app>/builds/<id>``: a build's state, its log from line ``since`` on, its result."""

    build_id: str
    app: str
    state: BuildState
    node_id: str = ""
    lines: list[str] = []
    next_line: int = 0  # ask again with ?since=next_line
    error: str = ""
    manifest_json: str = ""  # once ready: the manifest (JSON) read inside the image, its images locked
    started_at: float = 0.0
    finished_at: float = 0.0
