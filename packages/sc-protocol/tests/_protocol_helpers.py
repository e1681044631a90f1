"""Builders, hypothesis strategies and comparisons shared by the sc-protocol tests."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from hypothesis import settings
from hypothesis import strategies as st
from sc_protocol import DataProto

#: Property tests: no deadline (the machine is shared), modest example counts.
PROPERTY = settings(deadline=None, max_examples=30)

DTYPES = [torch.bool, torch.bfloat16, torch.int64, torch.float16, torch.float32, torch.uint8]


def make_tensor(rows: int, tail: tuple[int, ...], dtype: torch.dtype, seed: int) -> torch.Tensor:
    """A deterministic tensor with distinct-ish values of the given dtype."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randint(0, 100, (rows, *tail), generator=gen)
    if dtype == torch.bool:
        return base % 2 == 0
    return base.to(dtype)


def make_dp(
    rows: int = 6,
    *,
    tensors: bool = True,
    non_tensors: bool = True,
    meta: dict[str, Any] | None = None,
) -> DataProto:
    """A small batch with an int, a bfloat16 and a bool tensor column, and two numpy columns."""
    t: dict[str, torch.Tensor] = {}
    if tensors:
        t = {
            "ids": torch.arange(rows * 3, dtype=torch.int64).reshape(rows, 3),
            "logp": torch.arange(rows * 2, dtype=torch.float32).reshape(rows, 2).bfloat16(),
            "mask": torch.arange(rows) % 2 == 0,
        }
    nt: dict[str, Any] = {}
    if non_tensors:
        nt = {
            "uid": np.array([f"u{i}" for i in range(rows)], dtype=object),
            "score": np.arange(rows, dtype=np.float64),
        }
    return DataProto.from_dict(t, nt, meta if meta is not None else {"step": 3})


def row_ids(dp: DataProto) -> list[int]:
    """The row identities of a batch made by :func:`make_dp` (from its ``ids`` column)."""
    if dp.batch is None:
        return [int(s[1:]) for s in dp.non_tensor_batch["uid"]]
    return [int(x) // 3 for x in dp.batch["ids"][:, 0].tolist()]


def assert_dp_equal(a: DataProto, b: DataProto) -> None:
    """Same rows, keys, dtypes, shapes, values, non-tensor columns and meta_info."""
    assert type(a) is type(b)
    assert len(a) == len(b)
    assert (a.batch is None) == (b.batch is None)
    if a.batch is not None and b.batch is not None:
        assert a.batch.batch_size == b.batch.batch_size
        keys_a = sorted(map(str, a.batch.keys(include_nested=True, leaves_only=True)))
        keys_b = sorted(map(str, b.batch.keys(include_nested=True, leaves_only=True)))
        assert keys_a == keys_b
        for key in a.batch.keys(include_nested=True, leaves_only=True):
            x, y = a.batch[key], b.batch[key]
            assert x.dtype == y.dtype, key
            assert x.shape == y.shape, key
            assert torch.equal(x, y), key
    assert sorted(a.non_tensor_batch) == sorted(b.non_tensor_batch)
    for key, col in a.non_tensor_batch.items():
        other = b.non_tensor_batch[key]
        assert col.dtype == other.dtype, key
        assert col.shape == other.shape, key
        assert all(_same(x, y) for x, y in zip(col.ravel(), other.ravel(), strict=True)), key
    assert a.meta_info.keys() == b.meta_info.keys()


def _same(x: Any, y: Any) -> bool:
    if isinstance(x, np.ndarray):
        return isinstance(y, np.ndarray) and bool(np.array_equal(x, y))
    if isinstance(x, float) and np.isnan(x):
        return isinstance(y, float) and bool(np.isnan(y))
    return bool(x == y)


@st.composite
def data_protos(draw: st.DrawFn, min_rows: int = 0, max_rows: int = 9) -> DataProto:
    """Random batches: 0-3 tensor columns of random dtype and trailing shape, 0-2 numpy
    columns (object: strings / lists / ints; numeric float64), random meta_info."""
    rows = draw(st.integers(min_rows, max_rows))
    n_tensors = draw(st.integers(0, 3))
    tensors: dict[str, torch.Tensor] = {}
    for i in range(n_tensors):
        dtype = draw(st.sampled_from(DTYPES))
        tail = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        tensors[f"t{i}"] = make_tensor(rows, tail, dtype, seed=draw(st.integers(0, 1000)))
    non_tensors: dict[str, Any] = {}
    kinds = draw(st.lists(st.sampled_from(["str", "list", "int", "f64"]), max_size=2, unique=True))
    for kind in kinds:
        if kind == "str":
            values: list[Any] = [draw(st.text(max_size=4)) for _ in range(rows)]
            non_tensors["s"] = values
        elif kind == "list":
            non_tensors["l"] = [[j] * (j % 3) for j in range(rows)]
        elif kind == "int":
            non_tensors["i"] = np.arange(rows, dtype=np.int64) * 7
        else:
            non_tensors["f"] = np.linspace(0.0, 1.0, rows)
    if not tensors and not non_tensors:
        tensors["row"] = torch.arange(rows)
    meta = draw(
        st.dictionaries(st.sampled_from(["a", "b", "temperature"]), st.integers(), max_size=2)
    )
    return DataProto.from_dict(tensors, non_tensors, meta)
