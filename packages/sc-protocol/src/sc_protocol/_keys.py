"""Key operations over plain columns (a batch TensorDict or ``None``, a dict of numpy
columns and a ``meta_info`` dict): the key checks, select, pop and rename. Errors name the
DataProto method they serve; the DataProto methods of the same names call these."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from tensordict import TensorDict, TensorDictBase

from ._columns import Key, NDArray, _has_key, _key_str
from ._errors import InvalidSizeError, KeyConflictError, MissingKeyError, ProtocolTypeError

__all__ = ["pop_columns", "rename_columns", "require_keys", "select_columns"]

#: What select and pop return: tensor columns (or ``None``), numpy columns, ``meta_info``.
KeyedColumns = tuple[TensorDictBase | None, dict[str, NDArray], dict[str, Any]]
#: The keys a select or pop names: ``(batch_keys, non_tensor_batch_keys, meta_info_keys)``.
KeyLists = tuple[Sequence[Key] | None, Sequence[str] | None, Sequence[str] | None]


def require_keys(
    what: str,
    batch: TensorDictBase | None,
    non_tensor: dict[str, NDArray],
    meta: dict[str, Any],
    keys: KeyLists,
) -> None:
    """Raise :class:`~sc_protocol.MissingKeyError` for the first requested key that is not
    there (``DataProto.<what>`` in the message), a ProtocolTypeError for a bare string."""
    batch_keys, non_tensor_batch_keys, meta_info_keys = keys
    names = ("batch_keys", "non_tensor_batch_keys", "meta_info_keys")
    for name, given in zip(names, keys, strict=True):
        if isinstance(given, str):
            raise ProtocolTypeError(
                f"DataProto.{what}: {name} must be a list of keys, got the string {given!r}"
            )
    if batch_keys and batch is not None:
        available = [_key_str(k) for k in batch.keys(include_nested=True)]
        for key in batch_keys:
            if not _has_key(batch, key):
                raise MissingKeyError(
                    f"DataProto.{what}: batch key {_key_str(key)} not found; "
                    f"batch keys are [{', '.join(available)}]"
                )
    for key in non_tensor_batch_keys or ():
        if key not in non_tensor:
            raise MissingKeyError(
                f"DataProto.{what}: non-tensor key {key!r} not found; "
                f"non-tensor keys are {sorted(non_tensor)}"
            )
    for key in meta_info_keys or ():
        if key not in meta:
            raise MissingKeyError(
                f"DataProto.{what}: meta_info key {key!r} not found; "
                f"meta_info keys are {sorted(meta)}"
            )


def select_columns(
    batch: TensorDictBase | None,
    non_tensor: dict[str, NDArray],
    meta: dict[str, Any],
    keys: KeyLists,
    deepcopy: bool,
) -> KeyedColumns:
    """``DataProto.select``: the given keys (``None``: all of that kind); tensors shared,
    the rest deep-copied with ``deepcopy``."""
    require_keys("select", batch, non_tensor, meta, keys)
    batch_keys, non_tensor_batch_keys, meta_info_keys = keys
    if batch is not None:
        batch = batch.clone(False) if batch_keys is None else batch.select(*batch_keys)
    elif batch_keys:
        raise MissingKeyError(
            f"DataProto.select: batch keys {list(batch_keys)} requested, but the batch has "
            "no tensor columns"
        )
    if non_tensor_batch_keys is None:
        columns = dict(non_tensor)
    else:
        columns = {k: non_tensor[k] for k in non_tensor_batch_keys}
    chosen = dict(meta) if meta_info_keys is None else {k: meta[k] for k in meta_info_keys}
    if deepcopy:
        columns = copy.deepcopy(columns)
        chosen = copy.deepcopy(chosen)
    return batch, columns, chosen


def pop_columns(
    batch: TensorDictBase | None,
    non_tensor: dict[str, NDArray],
    meta: dict[str, Any],
    keys: KeyLists,
) -> KeyedColumns:
    """``DataProto.pop``: remove the keys from ``batch``, ``non_tensor`` and ``meta`` (in
    place, after checking every one) and return them."""
    batch_keys = list(keys[0] or [])
    non_tensor_batch_keys = list(keys[1] or [])
    meta_info_keys = list(keys[2] or [])
    if batch_keys and batch is None:
        raise MissingKeyError(
            f"DataProto.pop: batch keys {batch_keys} requested, but the batch has no tensor columns"
        )
    require_keys(
        "pop", batch, non_tensor, meta, (batch_keys, non_tensor_batch_keys, meta_info_keys)
    )
    popped_batch = None
    if batch_keys and batch is not None:
        popped = {key: batch.pop(key) for key in batch_keys}
        popped_batch = TensorDict(popped, batch_size=batch.batch_size, device=batch.device)
    popped_columns = {k: non_tensor.pop(k) for k in non_tensor_batch_keys}
    popped_meta = {k: meta.pop(k) for k in meta_info_keys}
    return popped_batch, popped_columns, popped_meta


def rename_columns(
    batch: TensorDictBase | None,
    non_tensor: dict[str, NDArray],
    old_keys: Key | Sequence[Key] | None,
    new_keys: Key | Sequence[Key] | None,
) -> None:
    """``DataProto.rename``: rename tensor or numpy columns in place, several at once (swaps
    allowed); everything is checked before anything changes."""
    olds: list[Key] = [old_keys] if isinstance(old_keys, (str, tuple)) else list(old_keys or [])
    news: list[Key] = [new_keys] if isinstance(new_keys, (str, tuple)) else list(new_keys or [])
    if len(olds) != len(news):
        raise InvalidSizeError(
            f"DataProto.rename: {len(olds)} old keys {olds} but {len(news)} new keys {news}"
        )
    if len(set(news)) != len(news):
        raise KeyConflictError(f"DataProto.rename: new keys {news} contain duplicates")
    if len(set(olds)) != len(olds):
        raise KeyConflictError(f"DataProto.rename: old keys {olds} contain duplicates")
    in_batch: list[bool] = []
    for old in olds:
        if batch is not None and _has_key(batch, old):
            in_batch.append(True)
        elif isinstance(old, str) and old in non_tensor:
            in_batch.append(False)
        else:
            raise MissingKeyError(f"DataProto.rename: key {_key_str(old)} not found")
    for old, new, tensor in zip(olds, news, in_batch, strict=True):
        taken = (batch is not None and _has_key(batch, new)) or (
            isinstance(new, str) and new in non_tensor
        )
        if taken and new not in olds:
            raise KeyConflictError(
                f"DataProto.rename: cannot rename {_key_str(old)} to {_key_str(new)}: "
                f"{_key_str(new)} already exists"
            )
        if not tensor and not isinstance(new, str):
            raise ProtocolTypeError(
                f"DataProto.rename: non-tensor key {_key_str(old)} can only be renamed to a "
                f"string, got {new!r}"
            )
    values: list[Any] = []
    for old, tensor in zip(olds, in_batch, strict=True):
        if tensor and batch is not None:
            values.append(batch.pop(old))
        else:
            values.append(non_tensor.pop(str(old)))
    for new, tensor, value in zip(news, in_batch, values, strict=True):
        if tensor and batch is not None:
            batch.set(new, value)
        else:
            non_tensor[str(new)] = value
