"""Padding removal and split/join invariants, blocking and non-blocking."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _core_fakes import PROPERTY, Batch, group
from hypothesis import given
from hypothesis import strategies as st
from sc_core import LazyFuture, LocalWorkerGroup
from sc_dispatch import Rows


@pytest.fixture(scope="module")
def wg3() -> Iterator[LocalWorkerGroup]:
    with group((3,)) as g:
        yield g


@PROPERTY
@given(n=st.integers(min_value=1, max_value=20))
def test_split_then_join_returns_every_row_once_in_order(wg3: LocalWorkerGroup, n: int) -> None:
    out = wg3.shard_rows(Batch(range(n)))
    assert [row for _, row in out.rows] == list(range(n))
    ranks = [r for r, _ in out.rows]
    assert ranks == sorted(ranks)


@PROPERTY
@given(n=st.integers(min_value=1, max_value=20))
def test_non_blocking_result_drops_padding_too(wg3: LocalWorkerGroup, n: int) -> None:
    fut = wg3.shard_rows.options(blocking=False)(Batch(range(n)))
    assert isinstance(fut, LazyFuture)
    assert [row for _, row in fut.get().rows] == list(range(n))


@PROPERTY
@given(n=st.integers(min_value=1, max_value=20))
def test_metric_keeps_one_result_per_worker(wg3: LocalWorkerGroup, n: int) -> None:
    out = wg3.metric(Batch(range(n)))
    assert [m["rank"] for m in out] == [0, 1, 2]
    sizes = {len(m["rows"]) for m in out}
    assert len(sizes) == 1  # padded: every worker got the same number of rows
    assert sum(len(m["rows"]) for m in out) == n + (-n) % 3


def test_non_blocking_futures_feed_the_next_call(wg3: LocalWorkerGroup) -> None:
    first = wg3.shard_lists.options(blocking=False)(Rows(range(6)))
    assert isinstance(first, LazyFuture)
    # The future is split lazily, one chunk per rank, and materialized in the worker.
    second = wg3.shard_lists(first)
    assert second == [100 * i for i in range(6)]


def test_non_blocking_metric_returns_one_future_per_worker(wg3: LocalWorkerGroup) -> None:
    futs = wg3.metric.options(blocking=False)(Batch(range(4)))
    assert len(futs) == 3
    assert [f.get()["rank"] for f in futs] == [0, 1, 2]


def test_non_blocking_rank_zero_returns_one_future(wg3: LocalWorkerGroup) -> None:
    fut = wg3.rank_zero.options(blocking=False)("x")
    assert isinstance(fut, LazyFuture)
    assert fut.get() == (0, "x")
