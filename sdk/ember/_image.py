"""``ember.Image``: the Python packages an app's replicas run with."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from ember._errors import InvalidSpecError
from ember.wire.images import (
    MAX_ENV,
    MAX_PACKAGES,
    ImageSpec,
    env_problem,
    find_links_problem,
    image_problems,
    package_problem,
    url_problem,
)

MAX_REQUIREMENTS_BYTES = 256 * 1024


class Image:
    """The environment an app's (or one function's) replicas run in: Python packages installed with ``uv`` into an
    environment of their own on each node, environment variables, a Python version.

    Each method returns a new image; the image is plain data until ``ember push`` has it locked and built on the
    platform (see docs/guides/images.md). Ember's own runtime is always there: do not install ``ember``.

    Args:
        python: the Python version (``"3.11"``); default: the nodes' own.
        index_url: the package index instead of PyPI.
        extra_index_urls: more indexes (the CUDA build of torch: ``["https://download.pytorch.org/whl/cu124"]``).
        find_links: URLs (or, where the node's operator allows it, absolute folders on the node) of wheel lists.
        no_index: install only from ``find_links``.

    Example:
        >>> image = ember.Image().pip_install("humanize==4.9.0").env({"TOKENIZERS_PARALLELISM": "false"})
        >>> app = ember.App("reports", image=image)
    """

    def __init__(self, *, python: str | None = None, index_url: str | None = None,
                 extra_index_urls: Iterable[str] = (), find_links: Iterable[str] = (), no_index: bool = False) -> None:
        if python is not None and not isinstance(python, str):
            raise InvalidSpecError(f"Image(python={python!r}): a version string such as '3.11'")
        if not isinstance(no_index, bool):
            raise InvalidSpecError(f"Image(no_index={no_index!r}): True or False")
        if index_url is not None and (problem := url_problem(index_url, "Image(index_url=...)")):
            raise InvalidSpecError(problem)
        extra = _strings("extra_index_urls", extra_index_urls)
        links = _strings("find_links", find_links)
        for url in extra:
            if problem := url_problem(url, "Image(extra_index_urls=...)"):
                raise InvalidSpecError(problem)
        for link in links:
            if problem := find_links_problem(link):
                raise InvalidSpecError(f"Image(find_links=...): {problem}")
        self._spec = ImageSpec(python=python or "", index_url=index_url or "", extra_index_urls=extra,
                               find_links=links, no_index=no_index)
        self._check()

    @classmethod
    def _of(cls, spec: ImageSpec) -> Image:
        image = cls.__new__(cls)
        image._spec = spec
        image._check()
        return image

    def pip_install(self, *packages: str | Iterable[str]) -> Image:
        """This image with more packages: requirement specs such as ``"humanize==4.9.0"`` or ``"torch>=2.4"``.

        Example:
            >>> ember.Image().pip_install("numpy==2.1.0", "scipy")
        """
        specs: list[str] = []
        for item in packages:
            specs.extend([item] if isinstance(item, str) else _strings("pip_install", item))
        for spec in specs:
            if problem := package_problem(spec):
                raise InvalidSpecError(f"Image.pip_install(): {problem}")
        return self._with(packages=[*self._spec.packages, *(s.strip() for s in specs)])

    def requirements(self, path: str | Path) -> Image:
        """This image with the packages of a requirements file (read now; relative to the working directory, or
        to the app's file when the path does not exist there). Only requirement lines and comments: no options,
        URLs or paths (indexes go in ``Image(extra_index_urls=...)``).

        Example:
            >>> ember.Image().requirements("requirements.txt")
        """
        file = _requirements_file(path)  # the caller is two frames up
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise InvalidSpecError(f"Image.requirements({str(path)!r}): cannot read it: {exc}") from exc
        if len(data) > MAX_REQUIREMENTS_BYTES:
            raise InvalidSpecError(f"Image.requirements({str(path)!r}): over {MAX_REQUIREMENTS_BYTES} bytes")
        specs = []
        for number, raw in enumerate(data.decode(errors="replace").splitlines(), 1):
            line = raw.split(" #")[0].strip()
            if not line or line.startswith("#"):
                continue
            if problem := package_problem(line):
                raise InvalidSpecError(f"{file}, line {number}: {problem}")
            specs.append(line)
        return self._with(packages=[*self._spec.packages, *specs])

    def env(self, variables: Mapping[str, str]) -> Image:
        """This image with environment variables set in its replicas. Not for credentials: those go in a secret
        (``secrets=["name"]`` on the decorator), which is encrypted and never shown.

        Example:
            >>> ember.Image().env({"HF_HUB_OFFLINE": "1"})
        """
        if not isinstance(variables, Mapping):
            raise InvalidSpecError(f"Image.env({variables!r}): a dict of names to string values")
        for name, value in variables.items():
            if problem := env_problem(name, value):
                raise InvalidSpecError(f"Image.env(): {problem}")
        return self._with(env={**self._spec.env, **variables})

    @property
    def spec(self) -> ImageSpec:
        """The image as the manifest carries it."""
        return self._spec

    def __repr__(self) -> str:
        packages = ", ".join(self._spec.packages[:5]) + (", ..." if len(self._spec.packages) > 5 else "")
        return f"<ember.Image python={self._spec.python or 'node'} [{packages}]>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Image) and other._spec == self._spec

    def __hash__(self) -> int:
        return hash(self._spec)

    def _with(self, **changes: object) -> Image:
        import msgspec

        return Image._of(msgspec.structs.replace(self._spec, **changes))

    def _check(self) -> None:
        if len(self._spec.packages) > MAX_PACKAGES or len(self._spec.env) > MAX_ENV:
            raise InvalidSpecError(f"an image holds at most {MAX_PACKAGES} packages and {MAX_ENV} variables")
        for field, message in image_problems(self._spec, "Image"):
            raise InvalidSpecError(f"{field}: {message}")


def image_spec(where: str, image: object) -> ImageSpec | None:
    """``image=`` of ``App`` or a decorator: an ``ember.Image`` or None."""
    if image is None:
        return None
    if not isinstance(image, Image):
        raise InvalidSpecError(f"{where}(image={image!r}): an ember.Image, e.g. image=ember.Image().pip_install('x')")
    return image.spec


def image_field(where: str, image: object, default: ImageSpec | None) -> dict[str, ImageSpec]:
    """A decorator's ``image=``, else the app's image: the service spec's ``image`` field."""
    spec = image_spec(where, image) if image is not None else default
    return {"image": spec} if spec is not None else {}


def _strings(what: str, values: object) -> list[str]:
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise InvalidSpecError(f"Image {what}={values!r}: a list of strings")
    items = list(values)
    if not all(isinstance(v, str) for v in items):
        raise InvalidSpecError(f"Image {what}={items!r}: a list of strings")
    return items


def _requirements_file(path: str | Path) -> Path:
    """``path`` as given when it exists (or is absolute); else beside the file that called ``requirements()``."""
    file = Path(path)
    if file.is_absolute() or file.exists():
        return file
    import sys

    caller = sys._getframe(2).f_globals.get("__file__")
    if isinstance(caller, str) and (Path(caller).parent / file).exists():
        return Path(caller).parent / file
    return file
