"""Fast input validation: msgspec types rebuilt from the JSON Schema in a function's manifest.

The manifest carries each input type as JSON Schema (the platform never imports user code). Validating
with a generic JSON Schema library costs about a millisecond for a 64-number image; a msgspec decoder
built from the same schema takes microseconds. ``decoder_for`` handles the subset of JSON Schema that
msgspec itself emits (objects from Structs, arrays, numbers and strings with bounds, unions, enums,
``$ref``); for anything else it returns None and the caller falls back to the generic validator. A ``pattern``
takes the generic path too, where it is matched with RE2 (see ``patterns``), not with msgspec's ``re``.
"""

from __future__ import annotations

import typing
from typing import Annotated, Any, Literal

import msgspec

_META_KEYS = {
    "minimum": "ge", "maximum": "le", "exclusiveMinimum": "gt", "exclusiveMaximum": "lt", "multipleOf": "multiple_of",
    "minLength": "min_length", "maxLength": "max_length",
    "minItems": "min_length", "maxItems": "max_length", "minProperties": "min_length", "maxProperties": "max_length",
}
_IGNORED = {"title", "description", "default", "examples", "$comment"}


class Unsupported(Exception):
    """A schema outside the subset that converts to msgspec types."""


def decoder_for(schema: dict[str, Any]) -> msgspec.json.Decoder[Any] | None:
    """A decoder that accepts exactly what ``schema`` accepts, or None if the schema is not convertible."""
    decoders = decoders_for(schema)
    return decoders[0] if decoders is not None else None


def decoders_for(schema: dict[str, Any]) -> tuple[msgspec.json.Decoder[Any], msgspec.msgpack.Decoder[Any]] | None:
    """A JSON and a msgpack decoder that accept exactly what ``schema`` accepts (a base64 string in JSON is raw
    bytes in msgpack), or None if the schema is not convertible."""
    try:
        tp = _Converter(schema.get("$defs", {})).convert(schema)
        return msgspec.json.Decoder(tp), msgspec.msgpack.Decoder(tp)
    except (Unsupported, TypeError, ValueError):
        return None


class _Converter:
    def __init__(self, defs: dict[str, Any]) -> None:
        self._defs = defs
        self._done: dict[str, Any] = {}
        self._busy: set[str] = set()

    def convert(self, node: Any) -> Any:
        if node is True or node == {} or (isinstance(node, dict) and set(node) <= _IGNORED | {"$defs"}):
            return Any
        if not isinstance(node, dict):
            raise Unsupported(node)
        if "$ref" in node:
            return self._ref(node["$ref"])
        alternatives = node.get("anyOf", node.get("oneOf"))
        if alternatives is not None:
            return self._union([self.convert(n) for n in alternatives])
        if "enum" in node or "const" in node:
            values = node["enum"] if "enum" in node else [node["const"]]
            return Literal[tuple(values)]  # type: ignore[valid-type]
        kind = node.get("type")
        if isinstance(kind, list):
            return self._union([self.convert({**node, "type": k}) for k in kind])
        return self._typed(kind, node)

    def _typed(self, kind: Any, node: dict[str, Any]) -> Any:
        known = _IGNORED | set(_META_KEYS) | {"type", "items", "properties", "required", "additionalProperties"}
        if kind == "string" and node.get("contentEncoding") == "base64" and not set(node) - _IGNORED - {
                "type", "contentEncoding"}:
            return bytes  # msgspec's bytes: base64 in JSON, raw in msgpack (a length bound takes the generic path)
        if set(node) - known or node.get("format"):
            raise Unsupported(node)
        base: Any
        if kind == "string":
            base = str
        elif kind == "integer":
            base = int
        elif kind == "number":
            base = float
        elif kind == "boolean":
            return bool
        elif kind == "null":
            return None
        elif kind == "array":
            base = list[self.convert(node.get("items", {}))]  # type: ignore[misc]
        elif kind == "object":
            base = self._object(node)
        else:
            raise Unsupported(node)
        meta = {_META_KEYS[k]: v for k, v in node.items() if k in _META_KEYS}
        return Annotated[base, msgspec.Meta(**meta)] if meta else base

    def _object(self, node: dict[str, Any]) -> Any:
        extra = node.get("additionalProperties", True)
        if "properties" not in node:
            return dict[str, self.convert(extra if extra is not True else {})]  # type: ignore[misc]
        if extra not in (True, False):
            raise Unsupported(node)
        required = set(node.get("required", []))
        fields: list[Any] = []
        rename: dict[str, str] = {}
        for i, (name, sub) in enumerate(node["properties"].items()):
            attr = f"f{i}"
            rename[attr] = name
            tp = self.convert(sub)
            fields.append((attr, tp) if name in required else (attr, tp | msgspec.UnsetType, msgspec.UNSET))
        return msgspec.defstruct(node.get("title", "Input"), fields, kw_only=True, rename=rename,
                                 forbid_unknown_fields=extra is False)

    def _ref(self, ref: str) -> Any:
        name = ref.rsplit("/", 1)[-1]
        if not ref.startswith("#/$defs/") or name not in self._defs or name in self._busy:
            raise Unsupported(ref)  # recursive types take the generic path
        if name not in self._done:
            self._busy.add(name)
            self._done[name] = self.convert(self._defs[name])
            self._busy.discard(name)
        return self._done[name]

    @staticmethod
    def _union(types: list[Any]) -> Any:
        return typing.Union[tuple(types)]  # noqa: UP007 - built from a list at run time
