"""ROUND_ROBIN's dispatch and collect functions on their own (no worker group backend)."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_dispatch import Dispatch, DispatchArgumentError, Execute, NotShardableError
from sc_dispatch.ext import resolve_dispatch_mode
from sc_dispatch.testing import FakeWorkerGroup
from sc_ext_roundrobin import (
    ROUND_ROBIN,
    collect_round_robin,
    deal,
    dispatch_round_robin,
    undeal,
)

PROPERTY = settings(deadline=None, max_examples=50)


def test_the_mode_is_registered_under_its_name() -> None:
    assert Dispatch["ROUND_ROBIN"] is ROUND_ROBIN
    assert Dispatch.from_name("ROUND_ROBIN") is ROUND_ROBIN
    spec = resolve_dispatch_mode(ROUND_ROBIN)
    assert spec.dispatch_fn is dispatch_round_robin
    assert spec.collect_fn is collect_round_robin
    assert spec.functions is not None
    assert spec.functions.unpad_output is False
    assert spec.functions.collect_sees_dispatch is True
    assert spec.row_aligned is False


def test_deal_hands_out_like_cards() -> None:
    assert deal([0, 1, 2, 3, 4], 2) == [[0, 2, 4], [1, 3]]
    assert deal([0, 1], 3) == [[0], [1], []]
    assert deal([], 2) == [[], []]


def test_dispatch_deals_lists_and_repeats_the_rest() -> None:
    group = FakeWorkerGroup(2)
    args, kwargs = dispatch_round_robin(group, ["a", "b", "c"], 7, tags=("x", "y", "z"))
    assert args == [[["a", "c"], ["b"]], [7, 7]]
    assert kwargs == {"tags": [("x", "z"), ("y",)]}


def test_collect_restores_the_item_order() -> None:
    assert collect_round_robin(FakeWorkerGroup(3), [[0, 3], [1, 4], [2]]) == [0, 1, 2, 3, 4]
    assert collect_round_robin(FakeWorkerGroup(2), [(), ()]) == []


@PROPERTY
@given(items=st.lists(st.integers(), max_size=40), hands=st.integers(1, 9))
def test_undeal_inverts_deal(items: list[int], hands: int) -> None:
    dealt = deal(items, hands)
    assert all(len(a) >= len(b) for a, b in itertools.pairwise(dealt))
    assert max(map(len, dealt)) - min(map(len, dealt)) <= 1
    assert undeal(dealt) == items


@PROPERTY
@given(items=st.lists(st.text(max_size=3), max_size=30), world=st.integers(1, 6))
def test_dispatch_then_collect_is_the_identity(items: list[str], world: int) -> None:
    group = FakeWorkerGroup(world)
    args, _ = dispatch_round_robin(group, items)
    (per_rank,) = args
    assert len(per_rank) == world
    assert collect_round_robin(group, per_rank) == items


@PROPERTY
@given(items=st.lists(st.integers(), max_size=30), world=st.integers(1, 6))
def test_collect_through_the_spec_sees_the_deal(items: list[int], world: int) -> None:
    """The call's plan: one unit per rank holding its hand; its join is the mode's collect
    function, told how the call was dealt."""
    group = FakeWorkerGroup(world)
    spec = resolve_dispatch_mode(ROUND_ROBIN)
    plan = spec.plan(group, Execute.ALL, (items, "tag"), {"extra": tuple(items)})
    assert [u.slot for u in plan.units] == list(range(world))
    outputs = [[x * 2 for x in unit.args[0]] for unit in plan.units]
    assert plan.join(outputs) == [x * 2 for x in items]


def test_the_deal_catches_counts_that_only_look_like_a_deal() -> None:
    group = FakeWorkerGroup(2)
    dispatched = dispatch_round_robin(group, [1, 2, 3, 4])
    # [2, 1] is a deal of 3 items, but rank 1 was dealt 2.
    assert collect_round_robin(group, [[1, 3], [2]]) == [1, 2, 3]
    with pytest.raises(DispatchArgumentError, match=r"rank 1 returned 1 results for the 2 items"):
        collect_round_robin(group, [[1, 3], [2]], dispatched=dispatched)
    by_keyword = dispatch_round_robin(group, scale=2, items=(1, 2, 3))
    assert collect_round_robin(group, [(1, 3), (2,)], dispatched=by_keyword) == [1, 2, 3]


def test_dispatched_arguments_without_hands_are_an_error() -> None:
    with pytest.raises(DispatchArgumentError, match=r"no dealt hands for 2 ranks"):
        collect_round_robin(FakeWorkerGroup(2), [[1], [2]], dispatched=([[5, 5]], {}))


def test_a_call_without_a_list_argument_is_an_error() -> None:
    with pytest.raises(DispatchArgumentError, match=r"ROUND_ROBIN: no list or tuple.*\['int'\]"):
        dispatch_round_robin(FakeWorkerGroup(2), 5)


def test_lists_of_different_lengths_are_an_error() -> None:
    with pytest.raises(DispatchArgumentError, match=r"one length.*'positional argument 0': 3"):
        dispatch_round_robin(FakeWorkerGroup(2), [1, 2, 3], other=[1])


@pytest.mark.parametrize("size", [0, -1, None, True, "2"])
def test_a_group_without_a_positive_world_size_is_an_error(size: Any) -> None:
    with pytest.raises(DispatchArgumentError, match=r"ROUND_ROBIN: .*world_size"):
        dispatch_round_robin(SimpleNamespace(world_size=size), [1])
    with pytest.raises(DispatchArgumentError, match=r"ROUND_ROBIN: .*world_size"):
        collect_round_robin(SimpleNamespace(world_size=size), [[1]])


def test_collect_checks_the_number_of_outputs() -> None:
    with pytest.raises(DispatchArgumentError, match=r"expected 3 outputs \(one per rank\), got 2"):
        collect_round_robin(FakeWorkerGroup(3), [[1], [2]])


def test_collect_rejects_a_rank_result_that_is_not_a_list() -> None:
    with pytest.raises(NotShardableError, match=r"rank 1 returned int"):
        collect_round_robin(FakeWorkerGroup(2), [[1], 2])


def test_collect_rejects_counts_that_are_no_deal() -> None:
    with pytest.raises(DispatchArgumentError, match=r"\[1, 3\] results.*expected \[2, 2\]"):
        collect_round_robin(FakeWorkerGroup(2), [[1], [2, 3, 4]])


def test_non_blocking_outputs_are_collected_into_one_future() -> None:
    from sc_core import LazyFuture

    parts = [LazyFuture.completed([0, 2]), LazyFuture.completed([1])]
    out = collect_round_robin(FakeWorkerGroup(2), parts)
    assert isinstance(out, LazyFuture)
    assert out.get() == [0, 1, 2]
    bad = collect_round_robin(FakeWorkerGroup(2), [LazyFuture.completed(5), [1]])
    with pytest.raises(NotShardableError, match=r"rank 0 returned int"):
        bad.get()


def test_deal_to_no_rank_is_an_error() -> None:
    with pytest.raises(DispatchArgumentError, match=r"cannot deal to 0 ranks"):
        deal([1], 0)
