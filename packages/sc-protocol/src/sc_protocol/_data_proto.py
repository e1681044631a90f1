"""DataProto: a batch of rows made of tensor columns, numpy columns and batch-level metadata.

The class is assembled from several modules: this one (the constructor, validation and
copying), :mod:`._convert` (from and to dicts and TensorDicts), :mod:`._indexing`,
:mod:`._key_ops` (select, pop, rename, union, concat), :mod:`._row_ops` (chunk, split,
reorder, repeat, padding, iteration), :mod:`._describe` (column listing, sizes) and
:mod:`._serialize` (pickling and files).
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from . import _convert, _describe, _indexing, _key_ops, _row_ops
from ._columns import IndexLike, Key, NDArray, _as_column, _key_str, _leaves
from ._errors import BatchSizeMismatchError, ProtocolTypeError
from ._item import DataProtoItem
from ._serialize import data_proto_reduce, load_data_proto, rebuild_data_proto, save_data_proto

__all__ = ["DataProto"]

D = TypeVar("D", bound="DataProto")

#: The name that pickles of sc-protocol 0.1 refer to; new pickles name
#: :func:`._serialize.rebuild_data_proto` itself.
_rebuild_data_proto = rebuild_data_proto


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
        if batch is not None and not isinstance(batch, TensorDictBase):
            raise ProtocolTypeError(
                f"DataProto: batch must be a TensorDict or None, got {type(batch).__name__}"
            )
        if non_tensor_batch is not None and not isinstance(non_tensor_batch, Mapping):
            raise ProtocolTypeError(
                f"DataProto: non_tensor_batch must be a dict of numpy arrays, "
                f"got {type(non_tensor_batch).__name__}"
            )
        if meta_info is not None and not isinstance(meta_info, Mapping):
            raise ProtocolTypeError(
                f"DataProto: meta_info must be a dict, got {type(meta_info).__name__}"
            )
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
        return _convert.from_dict(
            cls, tensors, non_tensors, meta_info, num_batch_dims, auto_padding
        )

    @classmethod
    def from_single_dict(
        cls: type[D],
        data: Mapping[str, torch.Tensor | NDArray],
        meta_info: Mapping[str, Any] | None = None,
        auto_padding: bool = False,
    ) -> D:
        """Build from one dict: tensors become tensor columns, numpy arrays non-tensor columns."""
        return _convert.from_single_dict(cls, data, meta_info, auto_padding)

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
        return _convert.from_tensordict(cls, tensor_dict, meta_info, num_batch_dims)

    def to_tensordict(self) -> TensorDict:
        """One TensorDict holding the whole batch, in verl's layout: the tensor columns as
        they are (shared, not copied), each non-tensor column as a ``NonTensorStack`` and
        each ``meta_info`` entry as ``NonTensorData``. :meth:`from_tensordict` gives the
        DataProto back. A name used by two kinds of entry is a
        :class:`~sc_protocol.KeyConflictError`."""
        return _convert.to_tensordict(self)

    # -- validation and basic protocol -------------------------------------------------

    def check_consistency(self) -> None:
        """Check that the batch has one batch dimension and every column the same number of
        rows; raise a typed error if not."""
        if self.batch is not None and self.batch.batch_dims != 1:
            raise BatchSizeMismatchError(
                f"DataProto: batch has {self.batch.batch_dims} batch dimensions "
                f"{list(self.batch.batch_size)}; a DataProto has exactly one, its rows "
                "(as in verl): give the TensorDict batch_size=[rows], or fold the extra "
                "dimensions with fold_batch_dim / unfold_batch_dim"
            )
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise ProtocolTypeError(
                    f"DataProto: non-tensor column {key!r} must be a numpy array, "
                    f"got {type(value).__name__}"
                )
        expected: int | None = None
        origin = ""
        if self.batch is not None:
            expected = int(self.batch.batch_size[0])
            origin = f"the tensor batch has {expected} rows"
        for key, value in self.non_tensor_batch.items():
            rows = int(value.shape[0]) if value.ndim else 0
            if expected is None:
                expected, origin = rows, f"non-tensor column {key!r} has {rows} rows"
            elif rows != expected:
                raise BatchSizeMismatchError(
                    f"DataProto: non-tensor column {key!r} has {rows} rows, but {origin}"
                )

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
        return _indexing.get_item(self, item)

    def slice(
        self: D, start: int | None = None, end: int | None = None, step: int | None = None
    ) -> D:
        """Rows ``start:end:step``: views (no copy) for a positive step; a negative step
        (``dp[::-1]``) selects the rows in that order (a copy, as ``select_idxs``)."""
        return _indexing.slice_rows(self, start, end, step)

    def select_idxs(self: D, idxs: IndexLike) -> D:
        """Rows at ``idxs`` (list, numpy array or tensor of ints, or a boolean mask)."""
        return _indexing.select_idxs(self, idxs)

    # -- keys (bodies in _key_ops) -------------------------------------------------------

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
        return _key_ops.select(self, batch_keys, non_tensor_batch_keys, meta_info_keys, deepcopy)

    def _require_keys(
        self,
        what: str,
        batch_keys: Sequence[Key] | None,
        non_tensor_batch_keys: Sequence[str] | None,
        meta_info_keys: Sequence[str] | None,
    ) -> None:
        return _key_ops._require_keys(self, what, batch_keys, non_tensor_batch_keys, meta_info_keys)

    def pop(
        self: D,
        batch_keys: Sequence[Key] | None = None,
        non_tensor_batch_keys: Sequence[str] | None = None,
        meta_info_keys: Sequence[str] | None = None,
    ) -> D:
        """Remove the given keys from this DataProto and return them as a new DataProto.

        Every key is checked before anything is removed.
        """
        return _key_ops.pop(self, batch_keys, non_tensor_batch_keys, meta_info_keys)

    def rename(
        self: D,
        old_keys: Key | Sequence[Key] | None = None,
        new_keys: Key | Sequence[Key] | None = None,
    ) -> D:
        """Rename columns in place (tensor or non-tensor), several at once; returns ``self``.

        Keys may be swapped (``rename(["a", "b"], ["b", "a"])``); a new name that is taken by
        a column not being renamed is an error.
        """
        return _key_ops.rename(self, old_keys, new_keys)

    def union(self: D, other: DataProto) -> D:
        """Add ``other``'s columns and ``meta_info`` to this DataProto (in place); returns ``self``.

        Keys present on both sides must hold equal values. Either side may have no tensor
        columns. Nothing is changed when an error is raised.
        """
        return _key_ops.union(self, other)

    @staticmethod
    def concat(data: Sequence[D]) -> D:
        """Join DataProtos row-wise. All must have the same keys.

        ``meta_info`` is merged as verl does: a key that several parts carry must have equal
        values (else a :class:`~sc_protocol.KeyConflictError` naming the key and both
        values), and ``meta_info["metrics"]`` -- a dict, or a list of dicts, per part -- is
        gathered into one dict of lists across the parts (``{"loss": [part0, part1]}``).
        """
        return _key_ops.concat(data)

    # -- rows (bodies in _row_ops) -------------------------------------------------------

    def is_padding_enabled(self: D) -> bool:
        """Whether this batch may be padded: its own flag or the global switch."""
        return _row_ops.is_padding_enabled(self)

    def chunk(self: D, chunks: int) -> list[D]:
        """Split into exactly ``chunks`` parts of views.

        Splitting is exact, as in verl: rows that do not divide evenly into ``chunks`` are an
        :class:`~sc_protocol.InvalidSizeError` naming both, unless padding is enabled for
        this batch (:meth:`is_padding_enabled`); then earlier parts are one row longer, and
        parts beyond the rows are empty (at most ``8 x`` as many parts as rows).
        """
        return _row_ops.chunk(self, chunks)

    def _split_sizes(self: D, sizes: list[int]) -> list[D]:
        return _row_ops._split_sizes(self, sizes)

    def split(self: D, split_size: int) -> list[D]:
        """Consecutive parts of ``split_size`` rows (the last may be shorter)."""
        return _row_ops.split(self, split_size)

    def reorder(self: D, indices: IndexLike) -> None:
        """Reorder rows in place by ``indices`` (list, numpy array or tensor)."""
        return _row_ops.reorder(self, indices)

    def _take(self: D, positions: NDArray) -> D:
        return _row_ops._take(self, positions)

    def repeat(self: D, repeat_times: int = 2, interleave: bool = True) -> D:
        """Repeat every row ``repeat_times`` times: ``aabb`` (interleave) or ``abab``."""
        return _row_ops.repeat(self, repeat_times, interleave)

    def sample_level_repeat(
        self: D, repeat_times: int | Sequence[int] | NDArray | torch.Tensor
    ) -> D:
        """Repeat row ``i`` ``repeat_times[i]`` times (interleaved)."""
        return _row_ops.sample_level_repeat(self, repeat_times)

    def unfold_column_chunks(self: D, n_split: int, split_keys: Sequence[Key] | None = None) -> D:
        """Turn every row into ``n_split`` rows.

        Columns in ``split_keys`` (tensor or non-tensor) are cut along their second dimension
        into ``n_split`` pieces, one per new row; every other column is repeated.
        """
        return _row_ops.unfold_column_chunks(self, n_split, split_keys)

    def padding(self: D, padding_size: int, padding_candidate: str = "") -> None:
        """Append ``padding_size`` rows in place.

        ``padding_candidate`` chooses them, as in verl: ``""`` (the default) and ``"last"``
        repeat the last row, ``"first"`` repeats the first row. (The padding that dispatch
        adds, like :func:`pad_dataproto_to_divisor`, repeats rows from the start instead.)
        """
        return _row_ops.padding(self, padding_size, padding_candidate)

    def to(self: D, device: str | torch.device) -> D:
        """Move the tensor columns to ``device`` (in place); returns ``self``."""
        return _row_ops.to(self, device)

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
        return _row_ops.make_iterator(self, mini_batch_size, epochs, seed, dataloader_kwargs)

    # -- inspection, copying, files ----------------------------------------------------

    def get_data_info(self) -> str:
        """A multi-line description of every column: key, shape, dtype, device."""
        return _describe.get_data_info(self)

    def print_size(self, prefix: str = "") -> str:
        """Log (at INFO, logger ``sc_protocol``) and return the size of the batch in GiB."""
        return _describe.print_size(self, prefix)

    # -- copying and serialization -----------------------------------------------------

    def __copy__(self: D) -> D:
        """A shallow copy shares the batch object, the columns and ``meta_info`` values."""
        obj = self._new(self.batch, dict(self.non_tensor_batch))
        return obj

    def __deepcopy__(self: D, memo: dict[int, Any]) -> D:
        """A deep copy clones every tensor and deep-copies the columns and ``meta_info``."""
        obj = type(self).__new__(type(self))
        memo[id(self)] = obj
        obj.batch = None if self.batch is None else self.batch.clone()
        obj.non_tensor_batch = copy.deepcopy(self.non_tensor_batch, memo)
        obj.meta_info = copy.deepcopy(self.meta_info, memo)
        return obj

    def __reduce_ex__(self, protocol: Any) -> tuple[Any, ...]:
        return data_proto_reduce(self, protocol)

    def save_to_disk(self, filepath: str | os.PathLike[str]) -> None:
        """Write this batch to ``filepath`` atomically (a temporary file in the same
        directory, then a rename).

        The file is a ``torch.save`` archive of tensors and plain Python values; a view
        (``dp[:10]``, a chunk) writes only its own rows. A save that dies half-way leaves a
        ``.sc-protocol-*.tmp`` file, which the next save into that directory removes. A
        ``meta_info`` value that cannot be pickled is a
        :class:`~sc_protocol.SerializationError` naming its key.
        """
        save_data_proto(self, filepath)

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
        return load_data_proto(cls, filepath, weights_only)
