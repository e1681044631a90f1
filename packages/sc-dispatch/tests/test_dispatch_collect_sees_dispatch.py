"""``collect_sees_dispatch``: a collect function that is told how its call was split."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import PROPERTY, FakeWorkerGroup, functions_of, run_call, unique_name
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch import ext, verl


def dispatch_uneven(worker_group: Any, items: list[int]) -> tuple[list[Any], dict[str, Any]]:
    """Item i goes to rank i % n, except every third item (i % 3 == 0), which goes to rank 0:
    a split that only the dispatch function knows."""
    n = worker_group.world_size
    hands: list[list[int]] = [[] for _ in range(n)]
    for i, item in enumerate(items):
        hands[i % n if i % 3 else 0].append(item)
    return [hands], {"scale": [2] * n}


def collect_with_split(
    worker_group: Any, outputs: Sequence[Any], *, dispatched: ext.Dispatched
) -> list[int]:
    """Put the results back where their items came from, using the dispatched hands."""
    (hands,), kwargs = dispatched
    assert list(kwargs) == ["scale"]  # the padding key never reaches collect
    n = worker_group.world_size
    owners = [i % n if i % 3 else 0 for i in range(sum(len(h) for h in hands))]
    taken = [0] * n
    out: list[int] = []
    for rank in owners:
        out.append(outputs[rank][taken[rank]])
        taken[rank] += 1
    return out


#: ``DispatchModeSpec.collect_fn`` keeps the two-argument type worker groups call.
aware: Any = collect_with_split


def doubled(rank: int, items: list[int], scale: int) -> list[int]:
    return [x * scale for x in items]


def test_the_flag_defaults_to_false_everywhere() -> None:
    for member in scd.Dispatch:
        try:
            spec = ext.resolve_dispatch_mode(member)
        except scd.UnknownDispatchModeError:
            continue
        assert functions_of(spec).collect_sees_dispatch is False
    spec = scd.ext.resolve_dispatch_mode({"dispatch_fn": dispatch_uneven, "collect_fn": len})
    assert functions_of(spec).collect_sees_dispatch is False


@PROPERTY
@given(items=st.lists(st.integers(-50, 50), max_size=25), world=st.integers(1, 5))
def test_collect_receives_what_dispatch_returned(items: list[int], world: int) -> None:
    mode: Mapping[str, Any] = {
        "dispatch_fn": dispatch_uneven,
        "collect_fn": collect_with_split,
        "collect_sees_dispatch": True,
    }
    assert run_call(FakeWorkerGroup(world), mode, doubled, items) == [2 * x for x in items]


def test_register_and_update_store_the_flag() -> None:
    mode = scd.register_dispatch_mode(
        unique_name(), dispatch_uneven, collect_with_split, collect_sees_dispatch=True
    )
    assert functions_of(mode).collect_sees_dispatch is True
    assert run_call(FakeWorkerGroup(3), mode, doubled, [1, 2, 3, 4]) == [2, 4, 6, 8]
    scd.update_dispatch_mode(mode, dispatch_uneven, collect_with_split, unpad_output=False)
    assert functions_of(mode).collect_sees_dispatch is True  # kept unless given
    assert functions_of(mode).unpad_output is False
    scd.update_dispatch_mode(
        mode, verl.dispatch_dp_compute, verl.collect_dp_compute, collect_sees_dispatch=False
    )
    assert functions_of(mode).collect_sees_dispatch is False


def test_a_plain_collect_function_is_called_as_before() -> None:
    seen: list[tuple[Any, ...]] = []

    def collect(worker_group: Any, outputs: Sequence[Any]) -> list[Any]:
        seen.append((worker_group, tuple(outputs)))
        return list(outputs)

    functions = scd.ext.FunctionMode("PLAIN", scd.verl.dispatch_one_to_all, collect)
    group = FakeWorkerGroup(2)
    assert functions.plan(group, (1,), {}).join([1, 2]) == [1, 2]
    assert seen == [(group, (1, 2))]


@pytest.mark.parametrize("value", [1, "yes", None, 0.0])
def test_the_flag_must_be_a_bool(value: Any) -> None:
    with pytest.raises(scd.DispatchModeTypeError, match=r"collect_sees_dispatch must be a bool"):
        scd.register_dispatch_mode(
            unique_name(), dispatch_uneven, collect_with_split, collect_sees_dispatch=value
        )
    with pytest.raises(scd.DispatchModeTypeError, match=rf"X: collect_sees_dispatch.*{value!r}"):
        scd.ext.FunctionMode("X", dispatch_uneven, aware, True, False, value)
    with pytest.raises(scd.DispatchModeTypeError, match=r"collect_sees_dispatch must be a bool"):
        ext.resolve_dispatch_mode(
            {
                "dispatch_fn": dispatch_uneven,
                "collect_fn": collect_with_split,
                "collect_sees_dispatch": value,
            }
        )
    if value is None:
        return  # update_dispatch_mode(..., collect_sees_dispatch=None) keeps the old value
    mode = scd.register_dispatch_mode(unique_name(), dispatch_uneven, collect_with_split)
    with pytest.raises(scd.DispatchModeTypeError, match=r"collect_sees_dispatch must be a bool"):
        scd.update_dispatch_mode(
            mode, dispatch_uneven, collect_with_split, collect_sees_dispatch=value
        )
    assert functions_of(mode).collect_sees_dispatch is False  # unchanged


def test_a_failed_registration_leaves_no_member_behind() -> None:
    name = unique_name()
    flag: Any = 1
    with pytest.raises(scd.DispatchModeTypeError):
        scd.register_dispatch_mode(
            name, dispatch_uneven, collect_with_split, collect_sees_dispatch=flag
        )
    assert name not in scd.Dispatch
