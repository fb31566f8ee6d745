"""What one replica asks for: GPUs (count, memory, types, MIG profile, topology), CPU and host memory.

``parse_gpu`` reads the forms ``gpu=`` accepts:

==============================  ===========================================================
``None`` or ``0``               CPU only
``2``                           two whole GPUs of any type
``"A10G"``, ``"H100:2"``        one / two whole GPUs of that type (``"any"`` for any type)
``["H100", "A100"]``            one whole GPU, H100 preferred, else A100
``"24GB"``, ``"L4:12GB"``       24 GB of one GPU of any type (replicas share GPUs by memory)
``"1g.10gb"``, ``"A100:1g.10gb"``  one MIG slice of that profile
``"H100:4:nvlink"``             four whole H100s joined by NVLink
a mapping / ``GpuRequest``      ``{"count", "memory_gb", "types", "mig", "topology"}``
==============================  ===========================================================
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import msgspec

from ember._errors import InvalidSpecError

Topology = Literal["nvlink"]

MAX_GPUS = 8
_TYPE = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")
_MEMORY = re.compile(r"(\d+(?:\.\d+)?)\s*GB", re.IGNORECASE)
_MIG = re.compile(r"(?:\d+c\.)?\d+g\.\d+gb(?:\+[a-z0-9]+)?")
_HINT = ('gpu=None, gpu=2, gpu="A10G", gpu="H100:2", gpu=["H100", "A100"], gpu="24GB", gpu="1g.10gb", '
         'gpu="H100:4:nvlink" or gpu={"count": 2, "memory_gb": 40, "types": ["H100"], "topology": "nvlink"}')
_LABELS = {"count": "count", "memory_mb": "memory", "mig_profile": "MIG profile", "topology": "topology",
           "types": "GPU type"}


class GpuRequest(msgspec.Struct, frozen=True, kw_only=True):
    """The GPUs one replica needs.

    ``memory_mb`` 0 takes each GPU whole; above 0, the replica reserves that much memory on each of its
    ``count`` GPUs and shares them with others. A MIG request takes one slice of ``mig_profile``.
    ``types`` is in preference order; empty means any type.
    """

    count: int = 0
    memory_mb: int = 0
    types: tuple[str, ...] = ()
    mig_profile: str = ""
    topology: Topology | None = None

    def __post_init__(self) -> None:
        problem = _problem(self)
        if problem:
            raise InvalidSpecError(f"gpu: {problem}")

    @property
    def cpu_only(self) -> bool:
        return self.count == 0

    @property
    def exclusive(self) -> bool:
        return self.memory_mb == 0


def _problem(r: GpuRequest) -> str:
    checks = [
        (not 0 <= r.count <= MAX_GPUS, f"count={r.count}: a GPU count is from 0 to {MAX_GPUS}"),
        (r.memory_mb < 0, f"memory_mb={r.memory_mb}: memory is >= 0"),
        (r.count == 0 and (r.memory_mb > 0 or bool(r.types) or r.topology is not None),
         "memory, types and topology need count >= 1"),
        (bool(r.mig_profile) and not _MIG.fullmatch(r.mig_profile),
         f"mig_profile={r.mig_profile!r} is not a MIG profile such as '1g.10gb'"),
        (bool(r.mig_profile) and (r.count != 1 or r.memory_mb > 0 or r.topology is not None),
         "a MIG request is one slice: count=1, no memory_gb and no topology"),
        (r.topology == "nvlink" and r.count < 2, f"topology='nvlink' joins GPUs: count must be >= 2, got {r.count}"),
        (any(not _TYPE.fullmatch(t) for t in r.types), f"types={list(r.types)}: a GPU type is a name like 'H100'"),
        (len(set(r.types)) != len(r.types), f"types={list(r.types)}: a type is listed twice"),
    ]
    return next((message for failed, message in checks if failed), "")


def parse_gpu(gpu: Any, *, where: str = "") -> GpuRequest:
    """The ``GpuRequest`` a ``gpu=`` argument stands for; ``InvalidSpecError`` says what is wrong.

    ``where`` names the caller in messages, e.g. ``"@app.function"``.
    """
    try:
        return _parse(gpu)
    except InvalidSpecError as exc:
        prefix = f"{where}(gpu={gpu!r})" if where else f"gpu={gpu!r}"
        raise InvalidSpecError(f"{prefix}: {exc.message.removeprefix('gpu: ')}; use {_HINT}") from None


def _parse(gpu: Any) -> GpuRequest:
    if isinstance(gpu, GpuRequest):
        return gpu
    if gpu is None or (isinstance(gpu, int) and not isinstance(gpu, bool) and gpu == 0):
        return GpuRequest()
    if isinstance(gpu, int) and not isinstance(gpu, bool):
        return GpuRequest(count=gpu)
    if isinstance(gpu, str):
        return _parse_text(gpu)
    if isinstance(gpu, Sequence) and gpu and all(isinstance(g, str) for g in gpu):
        return _parse_types(list(gpu))
    if isinstance(gpu, Mapping):
        return _parse_mapping(gpu)
    raise InvalidSpecError("not a GPU request")


def _parse_text(text: str) -> GpuRequest:
    fields: dict[str, Any] = {}
    for part in text.split(":"):
        name, value = _classify(part.strip())
        if name in fields:
            raise InvalidSpecError(f"{part!r}: a second {_LABELS[name]}" + (
                "; list several acceptable types as gpu=['H100', 'A100']" if name == "types" else ""))
        fields[name] = value
    return _build(fields)


def _classify(part: str) -> tuple[str, Any]:
    if part.isdigit():
        return "count", int(part)
    if _MIG.fullmatch(part):
        return "mig_profile", part
    memory = _MEMORY.fullmatch(part)
    if memory:
        return "memory_mb", _memory_mb(float(memory.group(1)))
    if part.lower() == "nvlink":
        return "topology", "nvlink"
    if part.lower() == "any":
        return "types", ()
    if _TYPE.fullmatch(part):
        return "types", (part,)
    raise InvalidSpecError(f"{part!r} is neither a count, a memory such as '24GB', a MIG profile, "
                           "'nvlink' nor a GPU type")


def _parse_types(types: list[str]) -> GpuRequest:
    if any(":" in t for t in types):
        raise InvalidSpecError("list GPU types without counts or memory, or use the mapping form")
    return _build({"types": tuple(t for t in types if t.lower() != "any")})


def _parse_mapping(gpu: Mapping[Any, Any]) -> GpuRequest:
    unknown = set(gpu) - {"count", "memory_gb", "types", "mig", "topology"}
    if unknown:
        raise InvalidSpecError(f"unknown key(s) {sorted(map(str, unknown))}")
    memory = gpu.get("memory_gb")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int | float) or memory <= 0):
        raise InvalidSpecError(f"memory_gb={memory!r}: a number of GB > 0")
    types = gpu.get("types") or ()
    if isinstance(types, str) or not all(isinstance(t, str) for t in types):
        raise InvalidSpecError(f"types={types!r}: a list of GPU type names")
    fields = {"count": gpu.get("count"), "memory_mb": _memory_mb(memory) if memory else None, "types": tuple(types),
              "mig_profile": gpu.get("mig") or None, "topology": gpu.get("topology")}
    return _build({k: v for k, v in fields.items() if v is not None})


def _build(fields: dict[str, Any]) -> GpuRequest:
    count = fields.pop("count", 1)
    if isinstance(count, bool) or not isinstance(count, int):
        raise InvalidSpecError(f"count={count!r}: a GPU count is an int")
    topology = fields.get("topology")
    if topology is not None and topology != "nvlink":
        raise InvalidSpecError(f"topology={topology!r}: the one topology is 'nvlink'")
    return GpuRequest(count=count, **fields)


def _memory_mb(gb: float) -> int:
    return math.ceil(gb * 1024)


def network_field(where: str, block_network: Any) -> dict[str, Any]:
    """``block_network=``: its replicas' own network has no way out (NATS only); a ``ServiceSpec`` field."""
    if not isinstance(block_network, bool):
        raise InvalidSpecError(f"{where}(block_network={block_network!r}): True or False")
    return {"block_network": True} if block_network else {}
