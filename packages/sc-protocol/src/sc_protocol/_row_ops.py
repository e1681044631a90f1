"""The row-level operations of :class:`~sc_protocol.DataProto`: chunk, split, reorder,
repeat, unfold, padding and mini-batch iteration (functions; the DataProto methods of
the same names call them)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from ._columns import IndexLike, Key, NDArray, _index_arrays, _key_str, _leaves
from ._config import DataProtoConfig
from ._errors import BatchSizeMismatchError, InvalidSizeError, MissingKeyError, ProtocolTypeError

if TYPE_CHECKING:
    from ._data_proto import DataProto

__all__ = [
    "chunk",
    "is_padding_enabled",
    "make_iterator",
    "padding",
    "reorder",
    "repeat",
    "sample_level_repeat",
    "split",
    "unfold_column_chunks",
]

D = TypeVar("D", bound="DataProto")

#: The most rows an operation may create (``repeat(2**40)`` is refused, not attempted).
_MAX_ROWS = 2**40


def _preview(values: NDArray) -> str:
    text = repr(values.tolist())
    return text if len(text) <= 60 else text[:57] + "..."


#: With padding enabled, ``chunk`` may return empty parts, but not more than this many
#: parts per row (``chunk(10**6)`` of a few rows would build a million objects).
_MAX_CHUNKS_PER_ROW = 8


def _pad_rows(data: D, extra: NDArray) -> D:
    """``data`` followed by its rows at positions ``extra`` (a new object)."""
    return data.concat([data, data._take(extra)])


def is_padding_enabled(data: D) -> bool:
    return bool(data.meta_info.get(DataProtoConfig.auto_padding_key, False)) or bool(
        DataProtoConfig.auto_padding
    )


def chunk(data: D, chunks: int) -> list[D]:
    if isinstance(chunks, bool) or not isinstance(chunks, int):
        raise ProtocolTypeError(f"DataProto.chunk: chunks must be an int, got {chunks!r}")
    n = len(data)
    if chunks < 1:
        raise InvalidSizeError(f"DataProto.chunk: chunks must be >= 1, got {chunks} ({n} rows)")
    if n % chunks and not data.is_padding_enabled():
        raise InvalidSizeError(
            f"DataProto.chunk: {n} rows do not divide evenly into {chunks} chunks "
            f"({n} % {chunks} = {n % chunks}); pad the batch first "
            "(pad_dataproto_to_divisor) or enable auto-padding"
        )
    if chunks > max(n, 1) * _MAX_CHUNKS_PER_ROW:
        raise InvalidSizeError(
            f"DataProto.chunk: {chunks} chunks for {n} rows is more than "
            f"{_MAX_CHUNKS_PER_ROW} chunks per row; ask for at most "
            f"{max(n, 1) * _MAX_CHUNKS_PER_ROW}"
        )
    base, extra = divmod(n, chunks)
    sizes = [base + 1 if i < extra else base for i in range(chunks)]
    return data._split_sizes(sizes)


def _split_sizes(data: D, sizes: list[int]) -> list[D]:
    batches: list[TensorDictBase | None] = (
        [None] * len(sizes) if data.batch is None else list(data.batch.split(sizes, dim=0))
    )
    out: list[D] = []
    start = 0
    for size, batch in zip(sizes, batches, strict=True):
        stop = start + size
        non_tensor = {k: v[start:stop] for k, v in data.non_tensor_batch.items()}
        out.append(data._new(batch, non_tensor))
        start = stop
    return out


def split(data: D, split_size: int) -> list[D]:
    if isinstance(split_size, bool) or not isinstance(split_size, int) or split_size < 1:
        raise InvalidSizeError(
            f"DataProto.split: split_size must be a positive int, got {split_size!r}"
        )
    n = len(data)
    sizes = [min(split_size, n - start) for start in range(0, n, split_size)]
    return data._split_sizes(sizes) if sizes else []


def reorder(data: D, indices: IndexLike) -> None:
    n = len(data)
    positions, positions_t = _index_arrays(indices, n, "DataProto.reorder")
    if positions.shape[0] != n or not np.array_equal(np.sort(positions), np.arange(n)):
        raise InvalidSizeError(
            f"DataProto.reorder: indices must be a permutation of the {n} rows (each row "
            f"exactly once), got {positions.shape[0]} indices "
            f"{_preview(positions)}; use select_idxs to pick a subset or repeat rows"
        )
    if data.batch is not None:
        index = positions_t
        if data.batch.device is not None and data.batch.device.type != "cpu":
            index = positions_t.to(data.batch.device)
        data.batch = data.batch[index]
    data.non_tensor_batch = {k: v[positions] for k, v in data.non_tensor_batch.items()}


def _take(data: D, positions: NDArray) -> D:
    positions = positions.astype(np.int64, copy=False)
    batch = None
    if data.batch is not None:
        index = torch.from_numpy(positions)
        if data.batch.device is not None and data.batch.device.type != "cpu":
            index = index.to(data.batch.device)
        batch = data.batch[index]
    non_tensor = {k: v[positions] for k, v in data.non_tensor_batch.items()}
    return data._new(batch, non_tensor)


def repeat(data: D, repeat_times: int = 2, interleave: bool = True) -> D:
    if isinstance(repeat_times, bool) or not isinstance(repeat_times, int) or repeat_times < 0:
        raise InvalidSizeError(
            f"DataProto.repeat: repeat_times must be a non-negative int, got {repeat_times!r}"
        )
    n = len(data)
    total = n * repeat_times
    if total > _MAX_ROWS:
        raise InvalidSizeError(
            f"DataProto.repeat: {n} rows x repeat_times {repeat_times} = {total} rows is more "
            f"than a batch can hold ({_MAX_ROWS}); repeat fewer times"
        )
    rows = np.arange(n, dtype=np.int64)
    try:
        positions = np.repeat(rows, repeat_times) if interleave else np.tile(rows, repeat_times)
        return data._take(positions)
    except MemoryError:
        raise InvalidSizeError(
            f"DataProto.repeat: {n} rows x repeat_times {repeat_times} = {total} rows do not "
            "fit in memory; repeat fewer times"
        ) from None


def sample_level_repeat(data: D, repeat_times: int | Sequence[int] | NDArray | torch.Tensor) -> D:
    if isinstance(repeat_times, int) and not isinstance(repeat_times, bool):
        return data.repeat(repeat_times, interleave=True)
    if isinstance(repeat_times, torch.Tensor):
        counts = repeat_times.detach().cpu().reshape(-1).numpy()
    else:
        counts = np.asarray(repeat_times).reshape(-1)
    if counts.size and not np.issubdtype(counts.dtype, np.integer):
        raise ProtocolTypeError(
            f"DataProto.sample_level_repeat: repeat counts must be integers, got {counts.dtype}"
        )
    if counts.shape[0] != len(data):
        raise BatchSizeMismatchError(
            f"DataProto.sample_level_repeat: {counts.shape[0]} repeat counts for {len(data)} rows"
        )
    if counts.size and int(counts.min()) < 0:
        raise InvalidSizeError(
            f"DataProto.sample_level_repeat: repeat counts must be >= 0, got {int(counts.min())}"
        )
    positions = np.repeat(np.arange(len(data), dtype=np.int64), counts.astype(np.int64))
    return data._take(positions)


def unfold_column_chunks(data: D, n_split: int, split_keys: Sequence[Key] | None = None) -> D:
    if isinstance(n_split, bool) or not isinstance(n_split, int) or n_split < 1:
        raise InvalidSizeError(
            f"DataProto.unfold_column_chunks: n_split must be a positive int, got {n_split!r}"
        )
    split = list(split_keys or [])
    known_batch = [] if data.batch is None else list(data.batch.keys(include_nested=True))
    for key in split:
        if key not in known_batch and key not in data.non_tensor_batch:
            raise MissingKeyError(
                f"DataProto.unfold_column_chunks: split key {_key_str(key)} not found"
            )
    n = len(data)

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

    batch = None
    if data.batch is not None:
        source: dict[Key, torch.Tensor] = {}
        for key, value in _leaves(data.batch):
            if key in split:
                source[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
            else:
                source[key] = value.repeat_interleave(n_split, dim=0)
        batch = TensorDict(batch_size=[n * n_split], device=data.batch.device)
        for key, value in source.items():
            batch.set(key, value)
    non_tensor: dict[str, NDArray] = {}
    for key, value in data.non_tensor_batch.items():
        if key in split:
            non_tensor[key] = value.reshape(unfold_shape(key, tuple(value.shape)))
        else:
            non_tensor[key] = np.repeat(value, n_split, axis=0)
    return data._new(batch, non_tensor)


def padding(data: D, padding_size: int, padding_candidate: str = "") -> None:
    if isinstance(padding_size, bool) or not isinstance(padding_size, int) or padding_size < 0:
        raise InvalidSizeError(
            f"DataProto.padding: padding_size must be a non-negative int, got {padding_size!r}"
        )
    if padding_size == 0:
        return
    n = len(data)
    if n == 0:
        raise InvalidSizeError(
            f"DataProto.padding: cannot pad an empty batch with {padding_size} rows"
        )
    if padding_candidate == "first":
        extra = np.zeros(padding_size, dtype=np.int64)
    elif padding_candidate in ("", "last"):
        extra = np.full(padding_size, n - 1, dtype=np.int64)
    else:
        raise ProtocolTypeError(
            f"DataProto.padding: padding_candidate must be '', 'first' or 'last', "
            f"got {padding_candidate!r}"
        )
    padded = _pad_rows(data, extra)
    data.batch = padded.batch
    data.non_tensor_batch = padded.non_tensor_batch


def to(data: D, device: str | torch.device) -> D:
    if data.batch is not None:
        data.batch = data.batch.to(device)
    return data


def make_iterator(
    data: DataProto,
    mini_batch_size: int,
    epochs: int,
    seed: int | None = None,
    dataloader_kwargs: Mapping[str, Any] | None = None,
) -> Iterator[DataProto]:
    n = len(data)
    if isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int):
        raise ProtocolTypeError(
            f"make_iterator: mini_batch_size must be an int, got {mini_batch_size!r}"
        )
    if mini_batch_size < 1 or n % mini_batch_size:
        raise InvalidSizeError(
            f"make_iterator: mini_batch_size {mini_batch_size} must be positive and divide "
            f"the {n} rows"
        )
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise InvalidSizeError(f"make_iterator: epochs must be a non-negative int, got {epochs!r}")
    from torch.utils.data import DataLoader

    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    # The loader batches row indices; each mini-batch is one select_idxs (not one
    # DataProtoItem per row, stacked again).
    loader: DataLoader[Any] = DataLoader(
        dataset=range(n),  # type: ignore[arg-type]  # a Sequence works; stubs want Dataset
        batch_size=mini_batch_size,
        collate_fn=_SelectRows(data),
        generator=generator,
        **dict(dataloader_kwargs or {}),
    )
    meta = data.meta_info

    def generate() -> Iterator[DataProto]:
        for _ in range(epochs):
            for mini_batch in loader:
                mini_batch.meta_info = dict(meta)
                yield mini_batch

    return iter(generate())


class _SelectRows:
    """``collate_fn`` for :meth:`DataProto.make_iterator`: row indices to a DataProto."""

    def __init__(self, data: DataProto) -> None:
        self.data = data

    def __call__(self, indices: list[int]) -> DataProto:
        return self.data.select_idxs(np.asarray(indices, dtype=np.int64))
