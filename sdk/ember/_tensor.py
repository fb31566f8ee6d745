"""Arrays as a function's parameters and result: ``numpy.ndarray``, optionally ``Annotated`` with
:class:`Tensor` (dtype and shape).

Over Ember's own routes an array travels as JSON nested lists (or msgpack ones); inside msgpack frames the
Open Inference Protocol's routes send it compact (``ember.wire.tensors``). numpy is imported only where an array
is really built, never by ``import ember``.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

import msgspec

from ember._errors import InvalidInputError, InvalidSpecError
from ember.wire.tensors import (
    DATATYPE_OF_DTYPE,
    DATATYPES,
    MAX_TENSOR_RANK,
    TENSOR_EXT,
    TensorMeta,
    read_compact,
)


@dataclass(frozen=True)
class Tensor:
    """The dtype and shape of an array parameter or result, for validation and the ``/v2`` metadata.

    ``dtype`` is a numpy dtype name (``"float32"``, ``"int64"``, ``"uint8"``, ``"bool"``, ...); ``shape`` a tuple
    whose ``None`` (or ``-1``) dimensions take any size. Either may be left out.

    Example:
        >>> from typing import Annotated
        >>> import numpy as np
        >>> @app.function()
        ... def embed(pixels: Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, 64))]
        ...           ) -> Annotated[np.ndarray, ember.Tensor(dtype="float32", shape=(None, 8))]: ...
    """

    dtype: str | None = None
    shape: tuple[int | None, ...] | None = None

    def __post_init__(self) -> None:
        if self.dtype is not None and self.dtype not in DATATYPE_OF_DTYPE:
            raise InvalidSpecError(f"Tensor(dtype={self.dtype!r}): one of {sorted(DATATYPE_OF_DTYPE)}")
        if self.shape is not None:
            if not isinstance(self.shape, tuple | list) or len(self.shape) > MAX_TENSOR_RANK or not all(
                    d is None or (isinstance(d, int) and not isinstance(d, bool) and d >= -1) for d in self.shape):
                raise InvalidSpecError(f"Tensor(shape={self.shape!r}): a tuple of at most {MAX_TENSOR_RANK} sizes, "
                                       "each a whole number or None (any size)")
            object.__setattr__(self, "shape", tuple(None if d in (None, -1) else d for d in self.shape))

    def meta(self, name: str) -> TensorMeta:
        datatype = DATATYPE_OF_DTYPE[self.dtype] if self.dtype else ""
        shape = None if self.shape is None else [-1 if d is None else d for d in self.shape]
        return TensorMeta(name=name, datatype=datatype, shape=shape)


def tensor_of(hint: Any) -> Tensor | None:
    """The :class:`Tensor` an annotation declares: ``np.ndarray`` (any dtype and shape) or
    ``Annotated[np.ndarray, Tensor(...)]``; None for any other annotation."""
    declared = Tensor()
    if typing.get_origin(hint) is typing.Annotated:
        hint, *extras = typing.get_args(hint)
        declared = next((e for e in extras if isinstance(e, Tensor)), declared)
    if isinstance(hint, type) and hint.__name__ == "ndarray" and hint.__module__ == "numpy":
        return declared
    return None


def schema_of(tensor: Tensor) -> dict[str, Any]:
    """The JSON Schema of the array's nested lists (their depth and fixed sizes; the leaves' type with a dtype)."""
    if tensor.shape is None:
        return {"type": "array"}
    leaf: dict[str, Any] = {}
    if tensor.dtype is not None:
        leaf = {"type": "boolean" if tensor.dtype == "bool" else "number" if "float" in tensor.dtype else "integer"}
    node = leaf
    for size in reversed(tensor.shape):
        node = {"type": "array", "items": node} if node else {"type": "array"}
        if size is not None:
            node |= {"minItems": size, "maxItems": size}
    return node


def to_array(value: Any, tensor: Tensor, field: str) -> Any:
    """An input (nested lists, or a compact tensor from a msgpack frame) as a numpy array of the declared dtype
    and shape; ``InvalidInputError`` naming ``field`` when it is not one."""
    import numpy as np

    try:
        if isinstance(value, msgspec.msgpack.Ext) and value.code == TENSOR_EXT:
            compact = read_compact(value.data)
            dtype = np.dtype(DATATYPES[compact.datatype][0]).newbyteorder("<")
            # a writable copy, as an array from JSON is: the function may change it in place
            array = np.frombuffer(bytearray(compact.data), dtype=dtype).reshape(compact.shape)
            if tensor.dtype is not None and array.dtype != np.dtype(tensor.dtype):
                raise ValueError(f"datatype {compact.datatype}, not {DATATYPE_OF_DTYPE[tensor.dtype]}")
            array = array.astype(array.dtype.newbyteorder("="), copy=False)
        else:
            array = np.asarray(value, dtype=tensor.dtype)
            if array.dtype == object or array.dtype.kind in "USV":
                raise ValueError("an array is nested lists of numbers, all of one depth")
    except (ValueError, TypeError, OverflowError) as exc:
        raise InvalidInputError(f"not an array{f' of {tensor.dtype}' if tensor.dtype else ''}: {exc}",
                                field=field) from exc
    if tensor.shape is not None:
        fits = array.ndim == len(tensor.shape) and all(
            want is None or want == got for want, got in zip(tensor.shape, array.shape, strict=True))
        if not fits:
            wanted = tuple(-1 if d is None else d for d in tensor.shape)
            raise InvalidInputError(f"an array of shape {array.shape}, not {wanted}", field=field)
    return array
