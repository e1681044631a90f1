"""How a batch leaves the process: zero-copy pickling, and the on-disk format.

**Pickling.**
A tensor is pickled as its raw bytes plus dtype, shape and device. With pickle protocol 5
the bytes are a :class:`pickle.PickleBuffer` over the tensor's own memory (through a
``uint8`` numpy view, which also covers dtypes numpy lacks, such as ``bfloat16``): with a
``buffer_callback`` (what Ray uses) the memory is handed out of band, without any copy;
without one, pickle writes it straight into the stream, once. Older protocols fall back to
one ``bytes`` copy. Only the tensor's own elements travel, never the rest of a shared
storage; a non-contiguous tensor is made contiguous once and a tensor on an accelerator is
copied to the CPU once (and moved back on load).

On load the tensor is built over the received buffer with :func:`torch.frombuffer`, again
without a copy. A read-only buffer (Ray's object store hands out read-only memoryviews) is
aliased as well, unless :attr:`DataProtoConfig.copy_readonly_buffers` (environment
``SC_PROTOCOL_COPY_READONLY_BUFFERS=1``) asks for a private copy: PyTorch has no read-only
tensors, so writing in place into such a tensor writes into memory that other readers may share.
Buffers that pickle itself created for the in-band data belong to the new tensor alone and
are always aliased.

The batch of a DataProto (or of a :class:`DataProtoItem`) travels as its
:func:`tensordict_state` (:func:`batch_pickle_state`); :func:`rebuild_data_proto` builds a
DataProto back from it. The on-disk format is :mod:`._disk`.
"""

from __future__ import annotations

import ctypes
import pickle
from collections.abc import Mapping
from typing import Any, Protocol, TypeVar, cast

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._columns import NDArray
from ._config import DataProtoConfig
from ._errors import SerializationError

__all__ = [
    "batch_pickle_state",
    "check_picklable",
    "data_proto_state",
    "rebuild_data_proto",
    "rebuild_tensor",
    "rebuild_tensordict",
    "tensor_state",
    "tensordict_state",
]

#: Plain values that always pickle; anything else in ``meta_info`` is checked before a
#: batch is pickled or saved, so a failure names its key.
_PLAIN = (str, bytes, int, float, complex, bool, type(None), np.ndarray, np.generic, torch.Tensor)

# Version tag of the state tuples, so that a future format change can still read old data.
_FORMAT = 1


class _Batch(Protocol):
    """What :func:`rebuild_data_proto` fills in: a DataProto's three attributes."""

    batch: TensorDictBase | None
    non_tensor_batch: dict[str, NDArray]
    meta_info: dict[str, Any]


B = TypeVar("B", bound=_Batch)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise SerializationError(f"pickled tensor has unknown dtype {name!r}")
    return dtype


def tensor_state(tensor: torch.Tensor, protocol: int) -> tuple[Any, ...]:
    """The picklable state of one tensor (see the module docstring)."""
    requires_grad = tensor.requires_grad
    t = tensor.detach()
    device = str(t.device)
    if t.is_nested and t.layout == torch.jagged:
        nested: Any = t
        values = nested.values()
        offsets = nested.offsets()
        lengths = nested.lengths()
        return (
            "jagged",
            tensor_state(values, protocol),
            tensor_state(offsets, protocol),
            None if lengths is None else tensor_state(lengths, protocol),
            nested._ragged_idx,
            requires_grad,
        )
    if t.layout != torch.strided or t.is_quantized or t.is_nested:
        # Sparse, strided-nested, quantized...: rare in a batch; torch pickles these itself.
        return ("torch", tensor)
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    shape = tuple(t.shape)
    raw = t.reshape(-1).view(torch.uint8).numpy()
    data: Any = pickle.PickleBuffer(cast(Any, raw)) if protocol >= 5 else raw.tobytes()
    return ("raw", data, _dtype_name(t.dtype), shape, device, requires_grad)


def _buffer_to_tensor(data: Any) -> torch.Tensor:
    view = memoryview(data)
    if view.nbytes == 0:
        return torch.empty(0, dtype=torch.uint8)
    if view.ndim != 1 or view.format not in ("B", "b", "c"):
        view = view.cast("B")
    # ``bytes`` and ``bytearray`` here were created by the unpickler for this tensor alone.
    private = isinstance(data, (bytes, bytearray))
    if view.readonly and not private and DataProtoConfig.copy_readonly_buffers:
        return torch.frombuffer(bytearray(view), dtype=torch.uint8)
    if view.readonly:
        return torch.frombuffer(_writable_alias(view), dtype=torch.uint8)
    return torch.frombuffer(view, dtype=torch.uint8)


def _writable_alias(view: memoryview) -> Any:
    """A writable ctypes array over the memory of a read-only buffer, keeping it alive.

    ``torch.frombuffer`` aliases a read-only buffer anyway, with a warning; going through this
    alias states the choice once, here, without touching the (thread-unsafe) warning filters.
    """
    address = np.frombuffer(view, dtype=np.uint8).ctypes.data
    alias: Any = (ctypes.c_char * view.nbytes).from_address(address)
    alias._sc_owner = view  # the tensor holds the alias, the alias holds the buffer
    return alias


def rebuild_tensor(state: tuple[Any, ...]) -> torch.Tensor:
    """Inverse of :func:`tensor_state`."""
    kind = state[0]
    if kind == "torch":
        tensor: torch.Tensor = state[1]
        return tensor
    if kind == "jagged":
        _, values_s, offsets_s, lengths_s, ragged_idx, requires_grad = state
        values = rebuild_tensor(values_s)
        offsets = rebuild_tensor(offsets_s)
        lengths = None if lengths_s is None else rebuild_tensor(lengths_s)
        out = torch.nested.nested_tensor_from_jagged(
            values, offsets, lengths=lengths, jagged_dim=ragged_idx
        )
        return out.requires_grad_(True) if requires_grad else out
    if kind != "raw":
        raise SerializationError(f"pickled tensor has unknown kind {kind!r}")
    _, data, dtype_name, shape, device, requires_grad = state
    dtype = _dtype_from_name(dtype_name)
    flat = _buffer_to_tensor(data)
    t = torch.empty(shape, dtype=dtype) if flat.numel() == 0 else flat.view(dtype).reshape(shape)
    if device != "cpu":
        t = t.to(device)
    if requires_grad:
        t.requires_grad_(True)
    return t


def tensordict_state(td: TensorDictBase, protocol: int) -> tuple[Any, ...]:
    """The picklable state of a TensorDict: batch size, device, names and every entry."""
    entries: list[tuple[str, str, Any]] = []
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            entries.append((key, "t", tensor_state(value, protocol)))
        elif isinstance(value, TensorDict):
            entries.append((key, "td", tensordict_state(value, protocol)))
        else:
            # Non-tensor data, lazy stacks, tensorclasses: pickled as they are.
            entries.append((key, "obj", value))
    raw_names = list(cast(Any, td).names)
    names = raw_names if any(n is not None for n in raw_names) else None
    device = None if td.device is None else str(td.device)
    return (_FORMAT, tuple(td.batch_size), device, names, entries)


def rebuild_tensordict(state: tuple[Any, ...]) -> TensorDict:
    """Inverse of :func:`tensordict_state`."""
    version, batch_size, device, names, entries = state
    if version != _FORMAT:
        raise SerializationError(f"pickled TensorDict has unknown format version {version!r}")
    source: dict[str, Any] = {}
    for key, kind, payload in entries:
        if kind == "t":
            source[key] = rebuild_tensor(payload)
        elif kind == "td":
            source[key] = rebuild_tensordict(payload)
        else:
            source[key] = payload
    td = TensorDict(source, batch_size=batch_size, device=device)
    if names is not None:
        td.names = names
    return td


def batch_pickle_state(
    batch: TensorDictBase | None, meta_info: Mapping[str, Any], protocol: Any, what: str
) -> tuple[Any, ...] | None:
    """The picklable state of a batch's tensor columns (``None`` for none), after checking
    that ``meta_info`` pickles (:func:`check_picklable`, naming ``what``)."""
    proto = int(protocol) if isinstance(protocol, int) else pickle.DEFAULT_PROTOCOL
    check_picklable(meta_info, what)
    return None if batch is None else tensordict_state(batch, proto)


def data_proto_state(
    batch: TensorDictBase | None,
    non_tensor: dict[str, NDArray],
    meta_info: dict[str, Any],
    protocol: Any,
) -> dict[str, Any]:
    """What ``DataProto.__reduce_ex__`` pickles: the batch as :func:`tensordict_state`, the
    numpy columns and ``meta_info`` as they are (``meta_info`` checked first, as in
    :func:`batch_pickle_state`)."""
    proto = int(protocol) if isinstance(protocol, int) else pickle.DEFAULT_PROTOCOL
    check_picklable(meta_info, "DataProto pickling")
    batch_state = None if batch is None else tensordict_state(batch, proto)
    return {"batch": batch_state, "non_tensor_batch": non_tensor, "meta_info": meta_info}


def rebuild_data_proto(cls: type[B], state: dict[str, Any]) -> B:
    """The DataProto (of class ``cls``) that ``DataProto.__reduce_ex__`` pickled as
    ``state``: its batch's :func:`tensordict_state`, numpy columns and ``meta_info``."""
    batch_state = state.get("batch")
    obj = cls.__new__(cls)
    obj.batch = None if batch_state is None else rebuild_tensordict(batch_state)
    obj.non_tensor_batch = dict(state["non_tensor_batch"])
    obj.meta_info = dict(state["meta_info"])
    return obj


def _plain(value: Any, depth: int = 0) -> bool:
    if isinstance(value, _PLAIN):
        return True
    if depth < 4 and isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, Mapping):
        return all(_plain(k, depth + 1) and _plain(v, depth + 1) for k, v in value.items())
    return False


def check_picklable(values: Mapping[str, Any], what: str) -> None:
    """Raise :class:`~sc_protocol.SerializationError` naming the key whose value cannot be
    pickled (plain values are not even tried)."""
    for key, value in values.items():
        if _plain(value):
            continue
        try:
            pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise SerializationError(
                f"{what}: meta_info[{key!r}] (a {type(value).__qualname__}) cannot be "
                f"pickled: {type(exc).__name__}: {exc}"
            ) from exc
