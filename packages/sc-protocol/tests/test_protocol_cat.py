"""Joining TensorDicts: the numpy path for plain CPU columns equals torch.cat, and anything
it cannot hold takes torch.cat."""

from __future__ import annotations

from typing import Any, cast

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_protocol._columns import cat_tensordicts
from tensordict import TensorDict

DTYPES = [torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.float16]


def _td(rows: int, width: int, dtype: torch.dtype, seed: int) -> TensorDict:
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(rows, width, generator=gen) * 100).to(dtype)
    ids = torch.arange(rows, dtype=torch.int64) + seed
    return TensorDict({"x": x, "meta": {"ids": ids}}, batch_size=[rows])


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.integers(0, 7), min_size=1, max_size=5),
    width=st.integers(1, 4),
    dtype=st.sampled_from(DTYPES),
)
def test_numpy_join_equals_torch_cat(rows: list[int], width: int, dtype: torch.dtype) -> None:
    parts = [_td(n, width, dtype, i) for i, n in enumerate(rows)]
    got = cat_tensordicts(parts)
    want: Any = cast(Any, torch.cat)(parts, dim=0)
    assert got.batch_size == want.batch_size
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert got.get(key).dtype == want.get(key).dtype
        assert torch.equal(got.get(key), want.get(key))


def test_the_joined_batch_owns_its_memory() -> None:
    parts = [_td(3, 2, torch.float32, 0), _td(2, 2, torch.float32, 1)]
    joined = cat_tensordicts(parts)
    joined["x"][0, 0] = -1.0
    assert parts[0]["x"][0, 0] != -1.0


def test_columns_numpy_cannot_hold_take_torch_cat() -> None:
    parts = [_td(3, 2, torch.bfloat16, 0), _td(2, 2, torch.bfloat16, 1)]
    joined = cat_tensordicts(parts)
    assert joined["x"].dtype == torch.bfloat16
    assert torch.equal(joined["x"], torch.cat([p["x"] for p in parts]))
    grad = [TensorDict({"w": torch.ones(2, requires_grad=True)}, batch_size=[2])] * 2
    assert cat_tensordicts(grad)["w"].requires_grad
    mixed = [_td(2, 2, torch.float32, 0), _td(2, 2, torch.float64, 1)]
    assert cat_tensordicts(mixed)["x"].dtype == torch.cat([p["x"] for p in mixed]).dtype
