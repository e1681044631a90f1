"""How a batch is written to a file and read back, over plain columns (a batch TensorDict
or ``None``, a dict of numpy columns, ``meta_info``); ``DataProto.save_to_disk`` and
``load_from_disk`` call these.

:func:`save_columns` writes a ``torch.save`` archive of tensors and plain values
atomically (:mod:`._atomic_file`: a temporary file in the target directory, renamed over
the target; a save that dies half-way leaves a temporary that the next save removes). Views
are written compactly: only their own rows travel, never the rest of a shared storage.
:func:`load_columns` reads with ``torch.load(weights_only=True)`` unless the caller
explicitly trusts the file (``weights_only=False``): full unpickling runs whatever code a
crafted file names.
"""

from __future__ import annotations

import os
import pickle
import re
import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._atomic_file import write_atomically
from ._columns import NDArray, _object_column
from ._errors import SerializationError
from ._serialize import check_picklable

__all__ = ["compact", "load_columns", "save_columns"]

#: What a file holds: tensor columns (or ``None``), numpy columns, ``meta_info``.
Saved = tuple[TensorDict | None, dict[str, NDArray], dict[str, Any]]

_SAVE_FORMAT = "sc_protocol.DataProto"
_SAVE_VERSION = 1


def compact(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` itself when it owns its storage, else a copy of just its elements: a view
    (a slice, a chunk, one row) would otherwise carry the whole storage it looks into."""
    if tensor.layout != torch.strided or tensor.is_nested:
        return tensor
    own = tensor.numel() * tensor.element_size()
    if (
        tensor.untyped_storage().nbytes() > own
        or tensor.storage_offset()
        or not tensor.is_contiguous()
    ):
        return tensor.clone(memory_format=torch.contiguous_format)
    return tensor


def _column_payload(arr: NDArray) -> dict[str, Any]:
    if arr.dtype == object:
        return {"kind": "object", "shape": list(arr.shape), "items": list(arr.ravel())}
    if arr.dtype.kind in "US":
        return {
            "kind": "str",
            "dtype": arr.dtype.str,
            "shape": list(arr.shape),
            "items": arr.ravel().tolist(),
        }
    if arr.dtype.kind in "biufc" and arr.dtype.isnative:
        try:
            tensor = compact(torch.from_numpy(np.ascontiguousarray(arr)))
        except TypeError:
            pass
        else:
            return {"kind": "numeric", "dtype": arr.dtype.str, "tensor": tensor}
    return {"kind": "ndarray", "array": arr}


def _column_from_payload(key: str, payload: Mapping[str, Any], path: str) -> NDArray:
    kind = payload.get("kind")
    if kind == "object":
        flat = _object_column(payload["items"])
        return flat.reshape(tuple(payload["shape"]))
    if kind == "str":
        return np.array(payload["items"], dtype=np.dtype(payload["dtype"])).reshape(
            tuple(payload["shape"])
        )
    if kind == "numeric":
        arr: NDArray = payload["tensor"].numpy()
        return arr.astype(np.dtype(payload["dtype"]), copy=False)
    if kind == "ndarray":
        out: NDArray = payload["array"]
        return out
    raise SerializationError(f"load_from_disk: {path!r}: column {key!r} has unknown kind {kind!r}")


def _batch_payload(td: TensorDictBase) -> dict[str, Any]:
    entries: dict[str, Any] = {}
    for key, value in td.items():
        if isinstance(value, torch.Tensor):
            entries[key] = {"kind": "tensor", "tensor": compact(value)}
        elif isinstance(value, TensorDict):
            entries[key] = {"kind": "td", "td": _batch_payload(value)}
        else:
            entries[key] = {"kind": "obj", "value": value}
    return {
        "batch_size": list(td.batch_size),
        "device": None if td.device is None else str(td.device),
        "entries": entries,
    }


def _batch_from_payload(payload: Mapping[str, Any]) -> TensorDict:
    source: dict[str, Any] = {}
    for key, entry in payload["entries"].items():
        if entry["kind"] == "tensor":
            source[key] = entry["tensor"]
        elif entry["kind"] == "td":
            source[key] = _batch_from_payload(entry["td"])
        else:
            source[key] = entry["value"]
    return TensorDict(source, batch_size=payload["batch_size"], device=payload["device"])


def _to_payload(
    batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray], meta: Mapping[str, Any]
) -> dict[str, Any]:
    return {
        "format": _SAVE_FORMAT,
        "version": _SAVE_VERSION,
        "batch": None if batch is None else _batch_payload(batch),
        "non_tensor_batch": {k: _column_payload(v) for k, v in non_tensor.items()},
        "meta_info": meta,
    }


def _from_payload(payload: Any, path: str) -> Saved:
    if not isinstance(payload, dict) or payload.get("format") != _SAVE_FORMAT:
        raise SerializationError(f"load_from_disk: {path!r} is not a file written by save_to_disk")
    if payload.get("version") != _SAVE_VERSION:
        raise SerializationError(
            f"load_from_disk: {path!r} has format version {payload.get('version')!r}; this "
            f"sc-protocol reads version {_SAVE_VERSION}"
        )
    batch = None if payload["batch"] is None else _batch_from_payload(payload["batch"])
    non_tensor = {
        k: _column_from_payload(k, v, path) for k, v in payload["non_tensor_batch"].items()
    }
    meta: dict[str, Any] = payload["meta_info"]
    return batch, non_tensor, meta


# --- writing and reading files ---------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def save_columns(
    batch: TensorDictBase | None,
    non_tensor: Mapping[str, NDArray],
    meta: Mapping[str, Any],
    filepath: str | os.PathLike[str],
) -> None:
    """Write a batch's columns to ``filepath`` atomically (see the module docstring)."""
    check_picklable(meta, "DataProto.save_to_disk")
    payload = _to_payload(batch, non_tensor, meta)
    write_atomically(os.fspath(filepath), lambda fh: torch.save(payload, fh))


def load_columns(filepath: str | os.PathLike[str], weights_only: bool) -> Saved:
    """Read the columns written by :func:`save_columns` (see the module docstring)."""
    path = os.fspath(filepath)
    if weights_only is False:
        payload = torch.load(path, weights_only=False)
    else:
        try:
            with warnings.catch_warnings():
                # torch announces a sparse-invariant scan on every weights_only load.
                warnings.filterwarnings(
                    "ignore", message=".*sparse tensor invariants.*", category=UserWarning
                )
                payload = torch.load(path, weights_only=True)
        except pickle.UnpicklingError as exc:
            reason = _ANSI.sub("", str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            raise SerializationError(
                f"load_from_disk: {path!r} holds Python objects that safe loading refuses "
                f"({reason}); full unpickling can run any code the file names, so pass "
                "weights_only=False only for a file you trust"
            ) from exc
    return _from_payload(payload, path)
