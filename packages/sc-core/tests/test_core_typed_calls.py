"""``wg.call`` / ``wg.method`` at run time, and the generic worker-group types.

The static side (what mypy and pyright infer) is tested by the ``typing`` nox session on
``packages/sc-core/typing_tests``; here the same calls must behave like the bound methods.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _core_fakes import Batch, EchoWorker, group
from sc_core import (
    ClassWithInitArgs,
    LazyFuture,
    LocalWorkerGroup,
    MethodProxy,
    ResourcePool,
    UnknownMethodError,
    WorkerGroup,
)
from sc_dispatch import Rows


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup[EchoWorker]]:
    with group((2,)) as g:
        yield g


def test_call_is_the_bound_method(wg: LocalWorkerGroup[EchoWorker]) -> None:
    one: list[tuple[int, object, object]] = wg.call(EchoWorker.one_to_all, "v", key=3)
    assert one == wg.one_to_all("v", key=3) == [(0, "v", 3), (1, "v", 3)]
    assert wg.call(EchoWorker.rank_zero, "z") == (0, "z")
    assert wg.call(EchoWorker.shard_lists, Rows([1, 2])) == [10, 20]
    assert wg.call(EchoWorker.dp_compute, ["a", "b"]) == [(0, "a", None), (1, "b", None)]
    assert wg.call(EchoWorker.shard_rows, Batch([1, 2, 3, 4])) == wg.shard_rows(Batch([1, 2, 3, 4]))


def test_call_of_an_async_method_returns_the_awaited_values(
    wg: LocalWorkerGroup[EchoWorker],
) -> None:
    ranks: list[int] = wg.call(EchoWorker.async_rank)
    assert ranks == [0, 1]


def test_non_blocking_calls_return_futures(wg: LocalWorkerGroup[EchoWorker]) -> None:
    pending = wg.call(EchoWorker.later, 5)
    assert all(isinstance(f, LazyFuture) for f in pending)
    lazy = wg.method(EchoWorker.shard_lists).options(blocking=False)(Rows([1, 2]))
    assert isinstance(lazy, LazyFuture)
    assert lazy.get() == [10, 20]


def test_method_returns_the_bound_proxy(wg: LocalWorkerGroup[EchoWorker]) -> None:
    proxy = wg.method(EchoWorker.one_to_all)
    assert isinstance(proxy, MethodProxy)
    assert proxy is wg.one_to_all
    assert proxy.options(timeout=30)("t") == [(0, "t", None), (1, "t", None)]


def test_a_method_that_is_not_bound_is_an_error(wg: LocalWorkerGroup[EchoWorker]) -> None:
    with pytest.raises(UnknownMethodError, match=r"not_registered.*not a bound worker method"):
        wg.call(EchoWorker.not_registered)


def test_an_explicit_execute_mode_is_called_as_registered(
    wg: LocalWorkerGroup[EchoWorker],
) -> None:
    assert wg.call(EchoWorker.first_only) == 0


def test_worker_group_types_are_subscriptable_at_run_time() -> None:
    assert WorkerGroup[EchoWorker] is not None
    typed = LocalWorkerGroup[EchoWorker](ResourcePool([1]), ClassWithInitArgs(EchoWorker))
    try:
        assert typed.call(EchoWorker.rank_zero, 1) == (0, 1)
    finally:
        typed.close()
