"""Row operations over plain columns: a batch TensorDict (or ``None``) and a dict of numpy
columns. Each function checks its sizes (its errors name the DataProto method they serve)
and returns new columns or row positions; the DataProto methods of the same names call
them and wrap the result."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase
from torch.utils.data import DataLoader

from ._columns import Key, NDArray, _index_arrays, _key_str, _leaves
from ._errors import (
    BatchSizeMismatchError,
    IndexOutOfRangeError,
    InvalidSizeError,
    MissingKeyError,
    ProtocolTypeError,
)
from ._item import DataProtoItem

__all__ = [
    "Columns",
    "exact_chunk_sizes",
    "mini_batches",
    "padding_positions",
    "permute_rows",
    "repeat_rows",
    "row_item",
    "row_slice",
    "sample_repeat_positions",
    "split_sizes",
    "take_rows",
    "unfold_columns",
]

#: The row-carrying part of a batch: its tensor columns (or ``None``) and its numpy columns.
Columns = tuple[TensorDictBase | None, dict[str, NDArray]]


class _WithMeta(Protocol):
    """What :func:`mini_batches` yields: anything with a ``meta_info`` dict."""

    meta_info: dict[str, Any]


T = TypeVar("T", bound=_WithMeta)

#: The most rows an operation may create (``repeat(2**40)`` is refused, not attempted).
_MAX_ROWS = 2**40

#: With padding enabled, ``chunk`` may return empty parts, but not more than this many
#: parts per row (``chunk(10**6)`` of a few rows would build a million objects).
_MAX_CHUNKS_PER_ROW = 8


def _preview(values: NDArray) -> str:
    text = repr(values.tolist())
    return text if len(text) <= 60 else text[:57] + "..."


def take_rows(
    batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray], positions: NDArray
) -> Columns:
    """The rows at ``positions`` (validated int64 positions) of every column, in that order;
    the index goes to the batch's device first."""
    out = None
    if batch is not None:
        index = torch.from_numpy(positions)
        if batch.device is not None and batch.device.type != "cpu":
            index = index.to(batch.device)
        out = batch[index]
    return out, {k: v[positions] for k, v in non_tensor.items()}


def row_item(
    batch: TensorDictBase | None,
    non_tensor: Mapping[str, NDArray],
    meta: Mapping[str, Any],
    rows: int,
    item: int | np.integer[Any],
) -> DataProtoItem:
    """``dp[item]``: row ``item`` (negative counts from the end) as a :class:`DataProtoItem`
    with a copy of ``meta``."""
    i = int(item)
    if i < -rows or i >= rows:
        raise IndexOutOfRangeError(f"DataProto index {i} is out of range for {rows} rows")
    i %= rows
    return DataProtoItem(
        batch=None if batch is None else batch[i],
        non_tensor_batch={k: v[i] for k, v in non_tensor.items()},
        meta_info=dict(meta),
    )


def row_slice(start: int | None, end: int | None, step: int | None) -> slice:
    """``DataProto.slice``'s bounds, checked: ints or ``None``, a step other than zero."""
    for name, value in (("start", start), ("end", end), ("step", step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise ProtocolTypeError(
                f"DataProto.slice: {name} must be an int or None, got {value!r}"
            )
    if step == 0:
        raise InvalidSizeError("DataProto.slice: step must not be zero")
    return slice(start, end, step)


def exact_chunk_sizes(rows: int, chunks: int, padding: Callable[[], bool]) -> list[int]:
    """The part sizes of ``DataProto.chunk``: ``chunks`` equal parts, or, when the rows do
    not divide and ``padding()`` says padding is enabled, ``numpy.array_split`` sizes (at
    most 8 parts per row)."""
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        raise ProtocolTypeError(f"DataProto.chunk: chunks must be an int, got {chunks!r}")
    if chunks < 1:
        raise InvalidSizeError(f"DataProto.chunk: chunks must be >= 1, got {chunks} ({rows} rows)")
    if rows % chunks and not padding():
        raise InvalidSizeError(
            f"DataProto.chunk: {rows} rows do not divide evenly into {chunks} chunks "
            f"({rows} % {chunks} = {rows % chunks}); pad the batch first "
            "(pad_dataproto_to_divisor) or enable auto-padding"
        )
    if chunks > max(rows, 1) * _MAX_CHUNKS_PER_ROW:
        raise InvalidSizeError(
            f"DataProto.chunk: {chunks} chunks for {rows} rows is more than "
            f"{_MAX_CHUNKS_PER_ROW} chunks per row; ask for at most "
            f"{max(rows, 1) * _MAX_CHUNKS_PER_ROW}"
        )
    base, extra = divmod(rows, chunks)
    return [base + 1 if i < extra else base for i in range(chunks)]


def split_sizes(rows: int, split_size: int) -> list[int]:
    """The part sizes of ``DataProto.split``: ``split_size`` rows each, the last shorter."""
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
        raise InvalidSizeError(
            f"DataProto.split: split_size must be a positive int, got {split_size!r}"
        )
    return [min(split_size, rows - start) for start in range(0, rows, split_size)]


def permute_rows(
    batch: TensorDictBase | None, non_tensor: Mapping[str, NDArray], rows: int, indices: Any
) -> Columns:
    """``DataProto.reorder``: the rows in the order of ``indices`` (a list, numpy array or
    tensor), which must name each of the ``rows`` rows once."""
    positions = _index_arrays(indices, rows, "DataProto.reorder")
    if positions.shape[0] != rows or not np.array_equal(np.sort(positions), np.arange(rows)):
        raise InvalidSizeError(
            f"DataProto.reorder: indices must be a permutation of the {rows} rows (each row "
            f"exactly once), got {positions.shape[0]} indices "
            f"{_preview(positions)}; use select_idxs to pick a subset or repeat rows"
        )
    return take_rows(batch, non_tensor, positions)


def repeat_rows(
    batch: TensorDictBase | None,
    non_tensor: Mapping[str, NDArray],
    rows: int,
    repeat_times: int,
    interleave: bool,
) -> Columns:
    """Every row ``repeat_times`` times: ``aabb`` (``interleave``) or ``abab``."""
    if isinstance(repeat_times, bool) or not isinstance(repeat_times, int) or repeat_times < 0:
        raise InvalidSizeError(
            f"DataProto.repeat: repeat_times must be a non-negative int, got {repeat_times!r}"
        )
    total = rows * repeat_times
    if total > _MAX_ROWS:
        raise InvalidSizeError(
            f"DataProto.repeat: {rows} rows x repeat_times {repeat_times} = {total} rows is "
            f"more than a batch can hold ({_MAX_ROWS}); repeat fewer times"
        )
    base = np.arange(rows, dtype=np.int64)
    try:
        positions = np.repeat(base, repeat_times) if interleave else np.tile(base, repeat_times)
        return take_rows(batch, non_tensor, positions)
    except MemoryError:
        raise InvalidSizeError(
            f"DataProto.repeat: {rows} rows x repeat_times {repeat_times} = {total} rows do "
            "not fit in memory; repeat fewer times"
        ) from None


def sample_repeat_positions(
    rows: int, repeat_times: int | Sequence[int] | NDArray | torch.Tensor
) -> NDArray:
    """The positions of ``DataProto.sample_level_repeat``: row ``i`` ``repeat_times[i]``
    times, in order."""
    if isinstance(repeat_times, torch.Tensor):
        counts = repeat_times.detach().cpu().reshape(-1).numpy()
    else:
        counts = np.asarray(repeat_times).reshape(-1)
    if counts.size and not np.issubdtype(counts.dtype, np.integer):
        raise ProtocolTypeError(
            f"DataProto.sample_level_repeat: repeat counts must be integers, got {counts.dtype}"
        )
    if counts.shape[0] != rows:
        raise BatchSizeMismatchError(
            f"DataProto.sample_level_repeat: {counts.shape[0]} repeat counts for {rows} rows"
        )
    if counts.size and int(counts.min()) < 0:
        raise InvalidSizeError(
            f"DataProto.sample_level_repeat: repeat counts must be >= 0, got {int(counts.min())}"
        )
    return np.repeat(np.arange(rows, dtype=np.int64), counts.astype(np.int64))


def unfold_columns(
    batch: TensorDictBase | None,
    non_tensor: Mapping[str, NDArray],
    rows: int,
    n_split: int,
    split_keys: Sequence[Key] | None,
) -> Columns:
    """``DataProto.unfold_column_chunks``: columns in ``split_keys`` cut along dimension 1
    into ``n_split`` rows each, every other column repeated ``n_split`` times."""
    if isinstance(n_split, bool) or not isinstance(n_split, int) or n_split < 1:
        raise InvalidSizeError(
            f"DataProto.unfold_column_chunks: n_split must be a positive int, got {n_split!r}"
        )
    split = list(split_keys or [])
    known_batch = [] if batch is None else list(batch.keys(include_nested=True))
    for key in split:
        if key not in known_batch and key not in non_tensor:
            raise MissingKeyError(
                f"DataProto.unfold_column_chunks: split key {_key_str(key)} not found"
            )

    def unfold_shape(key: Key, shape: tuple[int, ...]) -> tuple[int, ...]:
        if len(shape) < 2:
            raise BatchSizeMismatchError(
                f"DataProto.unfold_column_chunks: column {_key_str(key)} has shape {shape}; "
                "a split column needs a second dimension"
            )
        if shape[1] % n_split:
            raise InvalidSizeError(
                f"DataProto.unfold_column_chunks: column {_key_str(key)} has {shape[1]} "
                f"entries in dimension 1, not divisible by n_split={n_split}"
            )
        return (shape[0] * n_split, shape[1] // n_split, *shape[2:])

    out = None
    if batch is not None:
        source: dict[Key, torch.Tensor] = {}
        for key, value in _leaves(batch):
            if key in split:
                source[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
            else:
                source[key] = value.repeat_interleave(n_split, dim=0)
        out = TensorDict(batch_size=[rows * n_split], device=batch.device)
        for key, value in source.items():
            out.set(key, value)
    columns: dict[str, NDArray] = {}
    for key, value in non_tensor.items():
        if key in split:
            columns[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
        else:
            columns[key] = np.repeat(value, n_split, axis=0)
    return out, columns


def padding_positions(rows: int, padding_size: int, padding_candidate: str) -> NDArray:
    """The rows ``DataProto.padding`` appends: the last row (``""``, ``"last"``) or the first
    (``"first"``), ``padding_size`` times."""
    if isinstance(padding_size, bool) or not isinstance(padding_size, int) or padding_size < 0:
        raise InvalidSizeError(
            f"DataProto.padding: padding_size must be a non-negative int, got {padding_size!r}"
        )
    if padding_size == 0:
        return np.zeros(0, dtype=np.int64)
    if rows == 0:
        raise InvalidSizeError(
            f"DataProto.padding: cannot pad an empty batch with {padding_size} rows"
        )
    if padding_candidate == "first":
        return np.zeros(padding_size, dtype=np.int64)
    if padding_candidate in ("", "last"):
        return np.full(padding_size, rows - 1, dtype=np.int64)
    raise ProtocolTypeError(
        f"DataProto.padding: padding_candidate must be '', 'first' or 'last', "
        f"got {padding_candidate!r}"
    )


def mini_batches(
    rows: int,
    mini_batch_size: int,
    epochs: int,
    seed: int | None,
    dataloader_kwargs: Mapping[str, Any] | None,
    select: Callable[[NDArray], T],
    meta: Mapping[str, Any],
) -> Iterator[T]:
    """``DataProto.make_iterator``: ``epochs`` passes of a DataLoader over the row indices
    (``seed`` seeds its generator); each mini-batch is one ``select`` of ``mini_batch_size``
    positions (not one row object per row, stacked again) and gets its own copy of
    ``meta``."""
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int):
        raise ProtocolTypeError(
            f"make_iterator: mini_batch_size must be an int, got {mini_batch_size!r}"
        )
    if mini_batch_size < 1 or rows % mini_batch_size:
        raise InvalidSizeError(
            f"make_iterator: mini_batch_size {mini_batch_size} must be positive and divide "
            f"the {rows} rows"
        )
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise InvalidSizeError(f"make_iterator: epochs must be a non-negative int, got {epochs!r}")
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader: DataLoader[T] = DataLoader(
        dataset=range(rows),  # type: ignore[arg-type]  # a Sequence works; stubs want Dataset
        batch_size=mini_batch_size,
        collate_fn=_SelectRows(select),
        generator=generator,
        **dict(dataloader_kwargs or {}),
    )

    def generate() -> Iterator[T]:
        for _ in range(epochs):
            for mini_batch in loader:
                mini_batch.meta_info = dict(meta)
                yield mini_batch

    return iter(generate())


class _SelectRows:
    """``collate_fn`` for :func:`mini_batches`: row indices to one selection."""

    def __init__(self, select: Callable[[NDArray], Any]) -> None:
        self.select = select

    def __call__(self, indices: list[int]) -> Any:
        return self.select(np.asarray(indices, dtype=np.int64))
