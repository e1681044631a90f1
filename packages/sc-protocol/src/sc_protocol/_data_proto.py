"""DataProto: a batch of rows made of tensor columns, numpy columns and batch-level metadata.

Every operation is defined here, once: a method holds verl's checks and either does the work
itself or calls a function over plain columns (a batch TensorDict or ``None``, a dict of
numpy arrays, ``meta_info``) that knows nothing of DataProto: :mod:`._convert` (from and to
dicts and TensorDicts), :mod:`._rows` (chunk sizes, gathers, repeat, unfold, padding rows,
mini-batches), :mod:`._keys` (select, pop, rename), :mod:`._union` (union and concat),
:mod:`._describe` (column listing, sizes), :mod:`._serialize` (pickling) and :mod:`._disk`
(files).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._columns import (
    IndexLike,
    Key,
    NDArray,
    _as_column,
    _index_arrays,
    _key_str,
    _leaves,
    check_arguments,
    check_columns,
)
from ._config import DataProtoConfig
from ._convert import columns_from_dict, columns_from_tensordict, columns_to_tensordict, split_dict
from ._describe import describe_columns, size_message
from ._disk import load_columns, save_columns
from ._errors import InvalidSizeError, ProtocolTypeError
from ._item import DataProtoItem
from ._keys import pop_columns, rename_columns, select_columns
from ._rows import (
    exact_chunk_sizes,
    mini_batches,
    padding_positions,
    permute_rows,
    repeat_rows,
    row_item,
    row_slice,
    sample_repeat_positions,
    split_sizes,
    take_rows,
    unfold_columns,
)
from ._serialize import data_proto_state, rebuild_data_proto
from ._union import _concat_meta, concat_columns, union_columns

__all__ = ["DataProto"]

D = TypeVar("D", bound="DataProto")


class DataProto:
    """A batch: tensor columns in a TensorDict, numpy columns, and batch-level ``meta_info``.

    Every column has the same number of rows (the first dimension). Construction validates
    that (see :meth:`check_consistency`). Operations that return a new DataProto give it a
    shallow copy of ``meta_info``; tensors and numpy columns are shared or viewed whenever
    possible. ``rename``, ``union``, ``reorder``, ``pop``, ``padding`` and ``to`` change the
    object in place, as in verl.
    """

    batch: TensorDictBase | None
    non_tensor_batch: dict[str, NDArray]
    meta_info: dict[str, Any]

    def __init__(
        self,
        batch: TensorDictBase | None = None,
        non_tensor_batch: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
    ) -> None:
        check_arguments(batch, non_tensor_batch, meta_info)
        self.batch = batch
        self.non_tensor_batch = {k: _as_column(k, v) for k, v in (non_tensor_batch or {}).items()}
        self.meta_info = dict(meta_info or {})
        self.check_consistency()

    # -- construction --------------------------------------------------------------------

    @classmethod
    def from_dict(
        cls: type[D],
        tensors: Mapping[str, torch.Tensor] | None = None,
        non_tensors: Mapping[str, Any] | None = None,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
        auto_padding: bool = False,
    ) -> D:
        """Build from a dict of tensors, a dict of numpy columns (or lists) and ``meta_info``.

        The rows are the tensors' first dimension, which must agree. ``num_batch_dims`` is
        verl's parameter: a DataProto has one batch dimension, and any other value is an
        :class:`~sc_protocol.InvalidSizeError`, as verl refuses it. Lists of lists become
        2-d object columns when their rows have one length (verl's ``np.array(value,
        dtype=object)``). ``auto_padding=True`` sets the per-object padding flag in
        ``meta_info``.
        """
        batch, columns, meta = columns_from_dict(
            tensors, non_tensors, meta_info, num_batch_dims, auto_padding
        )
        return cls(batch=batch, non_tensor_batch=columns, meta_info=meta)

    @classmethod
    def from_single_dict(
        cls: type[D],
        data: Mapping[str, torch.Tensor | NDArray],
        meta_info: Mapping[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> D:
        """Build from one dict: tensors become tensor columns, numpy arrays non-tensor columns."""
        tensors, non_tensors = split_dict(data)
        return cls.from_dict(tensors, non_tensors, meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(
        cls: type[D],
        tensor_dict: TensorDictBase,
        meta_info: Mapping[str, Any] | None = None,
        num_batch_dims: int = 1,
    ) -> D:
        """Build from a TensorDict (verl's layout, and what :meth:`to_tensordict` writes):
        tensors (and nested TensorDicts) stay in ``batch``; non-tensor stacks become numpy
        columns (numeric and string values get their numpy dtype back, anything else an
        object column); non-tensor data entries go to ``meta_info``."""
        batch, columns, meta = columns_from_tensordict(tensor_dict, meta_info, num_batch_dims)
        return cls(batch=batch, non_tensor_batch=columns, meta_info=meta)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding the whole batch, in verl's layout: the tensor columns as
        they are (shared, not copied), each non-tensor column as a ``NonTensorStack`` and
        each ``meta_info`` entry as ``NonTensorData``. :meth:`from_tensordict` gives the
        DataProto back. A name used by two kinds of entry is a
        :class:`~sc_protocol.KeyConflictError`."""
        return columns_to_tensordict(len(self), self.batch, self.non_tensor_batch, self.meta_info)

    # -- validation and basic protocol -------------------------------------------------

    def check_consistency(self) -> None:
        """Check that the batch has one batch dimension and every column the same number of
        rows; raise a typed error if not."""
        check_columns(self.batch, self.non_tensor_batch)

    def __len__(self) -> int:
        if self.batch is not None:
            return int(self.batch.batch_size[0])
        for value in self.non_tensor_batch.values():
            return int(value.shape[0])
        return 0

    def __repr__(self) -> str:
        keys = [] if self.batch is None else [_key_str(k) for k, _ in _leaves(self.batch)]
        return (
            f"{type(self).__name__}(rows={len(self)}, batch_keys=[{', '.join(keys)}], "
            f"non_tensor_keys={list(self.non_tensor_batch)}, meta_info_keys={list(self.meta_info)})"
        )

    def _new(self: D, batch: TensorDictBase | None, non_tensor: dict[str, NDArray]) -> D:
        """A new object of the same class, without re-validating what is known consistent."""
        obj = type(self).__new__(type(self))
        obj.batch = batch
        obj.non_tensor_batch = non_tensor
        obj.meta_info = dict(self.meta_info)
        return obj

    # -- indexing ------------------------------------------------------------------------

    @overload
    def __getitem__(self, item: int | np.integer[Any]) -> DataProtoItem: ...

    @overload
    def __getitem__(self: D, item: IndexLike) -> D: ...

    def __getitem__(self: D, item: Any) -> D | DataProtoItem:
        """``dp[i]`` is a :class:`DataProtoItem`; ``dp[a:b]``, ``dp[[i, j]]``, ``dp[array]``,
        ``dp[tensor]`` and ``dp[mask]`` are DataProtos."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (bool, np.bool_)):
            raise ProtocolTypeError(f"DataProto index must not be a bool, got {item!r}")
        if isinstance(item, (int, np.integer)):
            return row_item(self.batch, self.non_tensor_batch, self.meta_info, len(self), item)
        if isinstance(item, (list, tuple, range, np.ndarray, torch.Tensor)):
            return self.select_idxs(item)
        raise ProtocolTypeError(
            f"DataProto index must be an int, a slice, a list/array/tensor of indices or a "
            f"boolean mask, got {type(item).__name__}"
        )

    def slice(
        self: D, start: int | None = None, end: int | None = None, step: int | None = None
    ) -> D:
        """Rows ``start:end:step``: views (no copy) for a positive step; a negative step
        (``dp[::-1]``) selects the rows in that order (a copy, as ``select_idxs``)."""
        sl = row_slice(start, end, step)
        if step is not None and step < 0:
            return self.select_idxs(np.arange(len(self), dtype=np.int64)[sl])
        batch = None if self.batch is None else self.batch[sl]
        return self._new(batch, {k: v[sl] for k, v in self.non_tensor_batch.items()})

    def select_idxs(self: D, idxs: IndexLike) -> D:
        """Rows at ``idxs`` (list, numpy array or tensor of ints, or a boolean mask)."""
        positions = _index_arrays(idxs, len(self), "DataProto.select_idxs")
        return self._new(*take_rows(self.batch, self.non_tensor_batch, positions))

    def _take(self: D, positions: NDArray) -> D:
        """The rows at ``positions`` (validated int64 positions), in that order."""
        return self._new(*take_rows(self.batch, self.non_tensor_batch, positions))

    # -- keys ----------------------------------------------------------------------------

    def select(
        self: D,
        batch_keys: Sequence[Key] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
        deepcopy: bool = False,
    ) -> D:
        """A DataProto with only the given keys (``None`` keeps every key of that kind).

        Tensors are shared; ``deepcopy=True`` deep-copies the non-tensor columns and
        ``meta_info``.
        """
        keys = (batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch, columns, meta = select_columns(
            self.batch, self.non_tensor_batch, self.meta_info, keys, deepcopy
        )
        obj = self._new(batch, columns)
        obj.meta_info = meta
        return obj

    def pop(
        self: D,
        batch_keys: Sequence[Key] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> D:
        """Remove the given keys from this DataProto and return them as a new DataProto.

        Every key is checked before anything is removed.
        """
        keys = (batch_keys, non_tensor_batch_keys, meta_info_keys)
        batch, columns, meta = pop_columns(self.batch, self.non_tensor_batch, self.meta_info, keys)
        return type(self)(batch=batch, non_tensor_batch=columns, meta_info=meta)

    def rename(
        self: D,
        old_keys: Key | Sequence[Key] | None = None,
        new_keys: Key | Sequence[Key] | None = None,
    ) -> D:
        """Rename columns in place (tensor or non-tensor), several at once; returns ``self``.

        Keys may be swapped (``rename(["a", "b"], ["b", "a"])``); a new name that is taken by
        a column not being renamed is an error.
        """
        rename_columns(self.batch, self.non_tensor_batch, old_keys, new_keys)
        return self

    def union(self: D, other: DataProto) -> D:
        """Add ``other``'s columns and ``meta_info`` to this DataProto (in place); returns ``self``.

        Keys present on both sides must hold equal values. Either side may have no tensor
        columns. Nothing is changed when an error is raised.
        """
        if not isinstance(other, DataProto):
            raise ProtocolTypeError(
                f"DataProto.union: expected a DataProto, got {type(other).__name__}"
            )
        self.batch = union_columns(
            (self.batch, self.non_tensor_batch, self.meta_info, len(self)),
            (other.batch, other.non_tensor_batch, other.meta_info, len(other)),
        )
        return self

    @staticmethod
    def concat(data: Sequence[D]) -> D:
        """Join DataProtos row-wise. All must have the same keys.

        ``meta_info`` is merged as verl does: a key that several parts carry must have equal
        values (else a :class:`~sc_protocol.KeyConflictError` naming the key and both
        values), and ``meta_info["metrics"]`` -- a dict, or a list of dicts, per part -- is
        gathered into one dict of lists across the parts (``{"loss": [part0, part1]}``).
        """
        parts = list(data)
        if not parts:
            raise InvalidSizeError("DataProto.concat: nothing to concatenate (empty list)")
        for i, part in enumerate(parts):
            if not isinstance(part, DataProto):
                raise ProtocolTypeError(
                    f"DataProto.concat: part {i} is a {type(part).__name__}, not a DataProto"
                )
        batch, columns = concat_columns(
            [p.batch for p in parts], [p.non_tensor_batch for p in parts]
        )
        obj = parts[0]._new(batch, columns)
        obj.meta_info = _concat_meta([p.meta_info for p in parts])
        return obj

    # -- rows ----------------------------------------------------------------------------

    def is_padding_enabled(self: D) -> bool:
        """Whether this batch may be padded: its own flag or the global switch."""
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or bool(
            DataProtoConfig.auto_padding
        )

    def chunk(self: D, chunks: int) -> list[D]:
        """Split into exactly ``chunks`` parts of views.

        Splitting is exact, as in verl: rows that do not divide evenly into ``chunks`` are an
        :class:`~sc_protocol.InvalidSizeError` naming both, unless padding is enabled for
        this batch (:meth:`is_padding_enabled`); then earlier parts are one row longer, and
        parts beyond the rows are empty (at most ``8 x`` as many parts as rows).
        """
        return self._split_sizes(exact_chunk_sizes(len(self), chunks, self.is_padding_enabled))

    def _split_sizes(self: D, sizes: list[int]) -> list[D]:
        """Consecutive parts of ``sizes`` rows (views); the sizes must add up to the rows."""
        batches: list[TensorDictBase | None] = (
            [None] * len(sizes) if self.batch is None else list(self.batch.split(sizes, dim=0))
        )
        out: list[D] = []
        start = 0
        for size, batch in zip(sizes, batches, strict=True):
            stop = start + size
            out.append(
                self._new(batch, {k: v[start:stop] for k, v in self.non_tensor_batch.items()})
            )
            start = stop
        return out

    def split(self: D, split_size: int) -> list[D]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        sizes = split_sizes(len(self), split_size)
        return self._split_sizes(sizes) if sizes else []

    def reorder(self: D, indices: IndexLike) -> None:
        """Reorder rows in place by ``indices`` (list, numpy array or tensor)."""
        self.batch, self.non_tensor_batch = permute_rows(
            self.batch, self.non_tensor_batch, len(self), indices
        )

    def repeat(self: D, repeat_times: int = 2, interleave: bool = True) -> D:
        """Repeat every row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
        return self._new(
            *repeat_rows(self.batch, self.non_tensor_batch, len(self), repeat_times, interleave)
        )

    def sample_level_repeat(
        self: D, repeat_times: int | Sequence[int] | NDArray | torch.Tensor
    ) -> D:
        """Repeat row ``i`` ``repeat_times[i]`` times (interleaved)."""
        if isinstance(repeat_times, int) and not isinstance(repeat_times, bool):
            return self.repeat(repeat_times, interleave=True)
        return self._take(sample_repeat_positions(len(self), repeat_times))

    def unfold_column_chunks(self: D, n_split: int, split_keys: Sequence[Key] | None = None) -> D:
        """Turn every row into ``n_split`` rows.

        Columns in ``split_keys`` (tensor or non-tensor) are cut along their second dimension
        into ``n_split`` pieces, one per new row; every other column is repeated.
        """
        return self._new(
            *unfold_columns(self.batch, self.non_tensor_batch, len(self), n_split, split_keys)
        )

    def padding(self: D, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` rows in place.

        ``padding_candidate`` chooses them, as in verl: ``""`` (the default) and ``"last"``
        repeat the last row, ``"first"`` repeats the first row. (The padding that dispatch
        adds, like :func:`pad_dataproto_to_divisor`, repeats rows from the start instead.)
        """
        extra = padding_positions(len(self), padding_size, padding_candidate)
        if extra.size:
            padded = self._append_rows(extra)
            self.batch = padded.batch
            self.non_tensor_batch = padded.non_tensor_batch

    def _append_rows(self: D, positions: NDArray) -> D:
        """A new batch: this one followed by its rows at ``positions`` (int64)."""
        return self.concat([self, self._take(positions)])

    def to(self: D, device: str | torch.device) -> D:
        """Move the tensor columns to ``device`` (in place); returns ``self``."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def make_iterator(
        self,
        mini_batch_size: int,
        epochs: int,
        seed: int | None = None,
        dataloader_kwargs: Mapping[str, Any] | None = None,
    ) -> Iterator[DataProto]:
        """Iterate over mini-batches of ``mini_batch_size`` rows for ``epochs`` epochs.

        ``mini_batch_size`` must divide the number of rows. ``dataloader_kwargs`` go to
        :class:`torch.utils.data.DataLoader` (for example ``{"shuffle": True}``); ``seed``
        seeds its generator. Every mini-batch carries this batch's ``meta_info``.
        """
        return mini_batches(
            len(self),
            mini_batch_size,
            epochs,
            seed,
            dataloader_kwargs,
            self.select_idxs,
            self.meta_info,
        )

    # -- inspection ----------------------------------------------------------------------

    def get_data_info(self) -> str:
        """A multi-line description of every column: key, shape, dtype, device."""
        lines = describe_columns(self.batch, self.non_tensor_batch, self.meta_info)
        return "\n".join([f"{type(self).__name__} with {len(self)} rows", *lines])

    def print_size(self, prefix: str = "") -> str:
        """Log (at INFO, logger ``sc_protocol``) and return the size of the batch in GiB."""
        return size_message(self.batch, self.non_tensor_batch, prefix)

    # -- copying and serialization -----------------------------------------------------

    def __copy__(self: D) -> D:
        """A shallow copy shares the batch object, the columns and ``meta_info`` values."""
        return self._new(self.batch, dict(self.non_tensor_batch))

    def __deepcopy__(self: D, memo: dict[int, Any]) -> D:
        """A deep copy clones every tensor and deep-copies the columns and ``meta_info``."""
        obj = type(self).__new__(type(self))
        memo[id(self)] = obj
        obj.batch = None if self.batch is None else self.batch.clone()
        obj.non_tensor_batch = copy.deepcopy(self.non_tensor_batch, memo)
        obj.meta_info = copy.deepcopy(self.meta_info, memo)
        return obj

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        state = data_proto_state(self.batch, self.non_tensor_batch, self.meta_info, protocol)
        return (rebuild_data_proto, (type(self), state))

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Write this batch to ``filepath`` atomically (a temporary file in the same
        directory, then a rename).

        The file is a ``torch.save`` archive of tensors and plain Python values; a view
        (``dp[:10]``, a chunk) writes only its own rows. A save that dies half-way leaves a
        ``.sc-protocol-*.tmp`` file, which the next save into that directory removes. A
        ``meta_info`` value that cannot be pickled is a
        :class:`~sc_protocol.SerializationError` naming its key.
        """
        save_columns(self.batch, self.non_tensor_batch, self.meta_info, filepath)

    @classmethod
    def load_from_disk(
        cls: type[D], filepath: str | os.PathLike[str], weights_only: bool = True
    ) -> D:
        """Read a batch written by :meth:`save_to_disk`.

        By default the file is read with ``torch.load(weights_only=True)``, which never runs
        code from the file; a file holding arbitrary Python objects (an object column of
        custom classes, say) is then a :class:`~sc_protocol.SerializationError`. Full
        unpickling (``weights_only=False``) runs whatever code a crafted file names: pass it
        only for a file you trust. (verl always unpickles.)
        """
        batch, columns, meta = load_columns(filepath, weights_only)
        return cls(batch=batch, non_tensor_batch=columns, meta_info=meta)
