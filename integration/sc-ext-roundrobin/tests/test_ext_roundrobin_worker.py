"""WordCounter and ROUND_ROBIN through sc-core's in-process worker group."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_core import ClassWithInitArgs, LazyFuture, LocalWorkerGroup, ResourcePool, Worker
from sc_dispatch import DispatchArgumentError, NotShardableError, register
from sc_ext_roundrobin import ROUND_ROBIN, WordCounter

TEXTS = ["one", "two words", "three more words", "four of them now", "five"]


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup[WordCounter]]:
    group = LocalWorkerGroup(ResourcePool([3]), ClassWithInitArgs(WordCounter))
    yield group
    group.close()


def test_results_come_back_in_item_order(wg: LocalWorkerGroup[WordCounter]) -> None:
    assert wg.count_words(TEXTS) == [1, 2, 3, 4, 1]


def test_items_are_dealt_round_robin(wg: LocalWorkerGroup[WordCounter]) -> None:
    assert wg.owner(TEXTS) == [0, 1, 2, 0, 1]
    wg.count_words(TEXTS)
    assert wg.handled_count() == [2, 2, 1]


def test_other_arguments_go_to_every_rank(wg: LocalWorkerGroup[WordCounter]) -> None:
    out = wg.distinct_words(["A a b", "cc c", "Dd dd"], min_length=2)
    assert out == [set(), {"cc"}, {"dd"}]


def test_the_typed_spelling_calls_the_same_method(wg: LocalWorkerGroup[WordCounter]) -> None:
    counts: list[int] = wg.call(WordCounter.count_words, TEXTS)
    assert counts == [1, 2, 3, 4, 1]
    handled: list[int] = wg.call(WordCounter.handled_count)
    assert handled == [2, 2, 1]


def test_fewer_items_than_ranks(wg: LocalWorkerGroup[WordCounter]) -> None:
    assert wg.count_words(["a b"]) == [2]
    assert wg.count_words([]) == []


def test_worker_constructor_arguments_are_used() -> None:
    group = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(WordCounter, lowercase=False))
    try:
        assert group.distinct_words(["A a"]) == [{"A", "a"}]
    finally:
        group.close()


@settings(deadline=None, max_examples=10)
@given(texts=st.lists(st.text(alphabet="ab ", max_size=8), max_size=12), world=st.integers(1, 4))
def test_any_world_size_matches_a_plain_loop(texts: list[str], world: int) -> None:
    group = LocalWorkerGroup(ResourcePool([world]), ClassWithInitArgs(WordCounter))
    try:
        assert group.count_words(texts) == [len(t.split()) for t in texts]
    finally:
        group.close()


def test_non_blocking_calls_return_futures(wg: LocalWorkerGroup[WordCounter]) -> None:
    pending = wg.method(WordCounter.count_words).options(blocking=False)(TEXTS)
    assert isinstance(pending, LazyFuture)
    assert pending.get() == [1, 2, 3, 4, 1]


def test_a_dispatch_error_names_the_method(wg: LocalWorkerGroup[WordCounter]) -> None:
    with pytest.raises(DispatchArgumentError, match=r"LocalWorkerGroup.count_words: ROUND_ROBIN"):
        wg.count_words("not a list")  # type: ignore[arg-type]


class Sloppy(Worker):
    @register(dispatch_mode=ROUND_ROBIN)
    def drop_last(self, items: list[int]) -> list[int]:
        return items[:-1] if self.rank == 1 else items

    @register(dispatch_mode=ROUND_ROBIN)
    def scalar(self, items: list[int]) -> int:
        return len(items)


def test_a_rank_returning_the_wrong_count_is_an_error() -> None:
    group = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Sloppy))
    try:
        # [2, 1] would still be a deal of 3 items: only the per-call count catches it.
        with pytest.raises(
            DispatchArgumentError,
            match=r"drop_last: ROUND_ROBIN: rank 1 returned 1 results for the 2",
        ):
            group.drop_last([1, 2, 3, 4])
        with pytest.raises(NotShardableError, match=r"scalar: ROUND_ROBIN: rank 0 returned int"):
            group.scalar([1, 2])
        assert group.drop_last([1]) == [1]
    finally:
        group.close()
