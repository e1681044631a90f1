"""verl's plain encoding of tensors and TensorDicts: ``serialize_single_tensor`` and friends.

A tensor is encoded as ``(dtype name, shape, uint8 numpy array of its bytes)`` and a
TensorDict as ``(batch size, device name or None, {key: encoded tensor})``, where a nested
(jagged) tensor is ``(layout name, [encoded component, ...])``. verl pickles DataProtos this
way under ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy``; sc pickles them with protocol 5
instead (:mod:`._serialize`), and keeps these functions for code that encodes tensors
itself. Decoding copies the bytes, so the tensors it returns own their memory.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._errors import ProtocolTypeError, SerializationError

__all__ = [
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "serialize_single_tensor",
    "serialize_tensordict",
]

#: ``(dtype name, shape, bytes as a uint8 array)``
EncodedTensor = tuple[str, tuple[int, ...], Any]


def serialize_single_tensor(obj: torch.Tensor) -> EncodedTensor:
    """``(dtype name, shape, its bytes as a uint8 numpy array)`` of a dense tensor (copied to
    the CPU first if it lives elsewhere)."""
    if not isinstance(obj, torch.Tensor):
        raise ProtocolTypeError(
            f"serialize_single_tensor: expected a torch.Tensor, got {type(obj).__name__}"
        )
    if obj.is_nested or obj.layout != torch.strided:
        raise ProtocolTypeError(
            f"serialize_single_tensor: only dense tensors are encoded, got layout {obj.layout} "
            "(a TensorDict's nested tensors go through serialize_tensordict)"
        )
    flat = obj.detach().to("cpu").contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy() if flat.numel() else np.empty(0, dtype=np.uint8)
    return str(obj.dtype).removeprefix("torch."), tuple(obj.shape), data


def _dtype(name: object) -> torch.dtype:
    value = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(value, torch.dtype):
        raise SerializationError(f"deserialize_single_tensor: unknown dtype name {name!r}")
    return value


def deserialize_single_tensor(arr: Sequence[Any]) -> torch.Tensor:
    """The tensor of :func:`serialize_single_tensor`'s ``(dtype, shape, data)``, in memory of
    its own."""
    if not isinstance(arr, (tuple, list)) or len(arr) != 3:
        raise SerializationError(
            f"deserialize_single_tensor: expected (dtype, shape, data), got {type(arr).__name__}"
        )
    dtype_name, shape, data = arr
    dtype = _dtype(dtype_name)
    raw = bytearray(memoryview(data).cast("B"))
    size = torch.Size(shape)
    expected = size.numel() * torch.empty(0, dtype=dtype).element_size()
    if len(raw) != expected:
        raise SerializationError(
            f"deserialize_single_tensor: {len(raw)} bytes for a {dtype_name} tensor of shape "
            f"{list(size)}, which needs {expected}"
        )
    if not raw:
        return torch.empty(size, dtype=dtype)
    return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).view(size)


def serialize_tensordict(
    batch: TensorDictBase,
) -> tuple[tuple[int, ...], str | None, dict[str, Any]]:
    """``(batch size, device name or None, {key: encoding})`` of a flat TensorDict: dense
    tensors as :func:`serialize_single_tensor`, nested tensors as ``(layout name, [one
    encoding per component])``. A TensorDict inside it is a
    :class:`~sc_protocol.ProtocolTypeError`."""
    if not isinstance(batch, TensorDictBase):
        raise ProtocolTypeError(
            f"serialize_tensordict: expected a TensorDict, got {type(batch).__name__}"
        )
    encoded: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(value, torch.Tensor):
            raise ProtocolTypeError(
                f"serialize_tensordict: entry {key!r} is a {type(value).__name__}; this "
                "encoding holds tensors only (pickle the TensorDict instead)"
            )
        if value.is_nested:
            layout = str(value.layout).removeprefix("torch.")
            encoded[key] = (layout, [serialize_single_tensor(t) for t in value.unbind()])
        else:
            encoded[key] = serialize_single_tensor(value)
    device = None if batch.device is None else str(batch.device)
    return tuple(batch.batch_size), device, encoded


def _decode_entry(key: str, value: Any) -> torch.Tensor:
    if isinstance(value, (tuple, list)) and len(value) == 3:
        return deserialize_single_tensor(value)
    if isinstance(value, (tuple, list)) and len(value) == 2:
        layout_name, parts = value
        layout = getattr(torch, layout_name, None) if isinstance(layout_name, str) else None
        if not isinstance(layout, torch.layout):
            raise SerializationError(
                f"deserialize_tensordict: entry {key!r} has unknown layout {layout_name!r}"
            )
        return torch.nested.as_nested_tensor(
            [deserialize_single_tensor(p) for p in parts], layout=layout
        )
    raise SerializationError(
        f"deserialize_tensordict: entry {key!r} is not a tensor encoding (3 fields) or a "
        f"nested one (2 fields): {type(value).__name__}"
    )


def deserialize_tensordict(arr: Sequence[Any]) -> TensorDict:
    """The TensorDict of :func:`serialize_tensordict`'s ``(batch size, device, items)``."""
    if not isinstance(arr, (tuple, list)) or len(arr) != 3:
        raise SerializationError(
            "deserialize_tensordict: expected (batch_size, device, items), got "
            f"{type(arr).__name__}"
        )
    batch_size, device, items = arr
    if not isinstance(items, Mapping):
        raise SerializationError(
            f"deserialize_tensordict: items must be a dict, got {type(items).__name__}"
        )
    decoded = {key: _decode_entry(key, value) for key, value in items.items()}
    return TensorDict(decoded, batch_size=list(batch_size), device=device)
