"""Work plans without a worker group: the units of the even, balanced and sticky plans
partition the batch, joining the units' own rows gives the batch back (an identity
method), and the key affinity keeps keys where they are until a slot dies or falls behind."""

from __future__ import annotations

from typing import Any

import pytest
from _dispatch_fakes import Batch
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_dispatch import (
    DispatchArgumentError,
    DispatchModeTypeError,
    NotShardableError,
    Rows,
    make_sticky_dispatch_fn,
)
from sc_dispatch.ext import (
    DispatchModeSpec,
    KeyAffinity,
    MeshLayout,
    Slot,
    WorkPlan,
    WorkUnit,
    balanced_plan,
    even_plan,
    mesh_slots,
    rank_slots,
    resolve_dispatch_mode,
)
from sc_dispatch.testing import FakeWorkerGroup

PROPERTY = settings(deadline=None, max_examples=60)


def make_group(world_size: int, dead: tuple[int, ...] = ()) -> FakeWorkerGroup:
    """A worker group for planners; its mesh "m" pairs consecutive ranks (rank 2k collects)."""
    ranks = range(world_size)
    pairs = MeshLayout(tuple(r // 2 for r in ranks), tuple(r % 2 == 0 for r in ranks))
    return FakeWorkerGroup(world_size, {"m": pairs}, dead_ranks=dead)


def _identity_outputs(plan: WorkPlan) -> list[Any]:
    return [u.args[0] for u in plan.units]


def _check_partition(plan: WorkPlan, rows: int) -> None:
    seen = sorted(r for u in plan.units for r in u.rows)
    assert seen == list(range(rows))


@PROPERTY
@given(rows=st.integers(1, 50), world=st.integers(1, 6))
def test_the_even_plan_partitions_and_joins_back(rows: int, world: int) -> None:
    """Rows ask for padding only through an adapter that pads; Rows never pads, so the
    batch length is a multiple of the world size here."""
    batch = Rows(range(rows * world))
    plan = even_plan("EVEN", rank_slots(make_group(world)), (batch,), {})
    assert [u.slot for u in plan.units] == list(range(world))
    _check_partition(plan, rows * world)
    assert plan.join(_identity_outputs(plan)) == batch


@PROPERTY
@given(rows=st.integers(1, 60), world=st.integers(1, 5), size=st.integers(1, 12) | st.none())
def test_the_balanced_plan_partitions_in_order(rows: int, world: int, size: int | None) -> None:
    batch = Rows(range(rows))
    plan = balanced_plan("BAL", rank_slots(make_group(world)), (batch,), {}, size)
    assert all(u.slot is None for u in plan.units)
    limit = size or -(-rows // (4 * world))
    assert all(1 <= len(u.rows) <= limit for u in plan.units)
    _check_partition(plan, rows)
    assert [list(u.args[0]) for u in plan.units] == [list(u.rows) for u in plan.units]
    assert plan.join(_identity_outputs(plan)) == batch


def _doubled_outputs(plan: WorkPlan) -> list[Any]:
    """What a row-wise method returns for each unit (padding rows included)."""
    return [Batch([(x, 2 * x) for x in u.args[0].rows]) for u in plan.units]


@PROPERTY
@given(
    rows=st.integers(1, 40),
    world=st.integers(1, 5),
    size=st.integers(1, 9) | st.none(),
    mesh=st.booleans(),
)
def test_balanced_equals_even_as_plans(rows: int, world: int, size: int | None, mesh: bool) -> None:
    """One property for every way a call runs: the balanced plan's join of a row-wise
    method's outputs is the even plan's (whose batch is padded when it does not divide),
    on ranks or on a mesh's dp groups, whatever the micro-shard size."""
    group = make_group(2 * world)
    slots = mesh_slots(group, "m") if mesh else rank_slots(make_group(world))
    batch = Batch(range(rows))
    even = even_plan("EVEN", slots, (batch,), {})
    balanced = balanced_plan("BAL", slots, (batch,), {}, size)
    expected = Batch([(x, 2 * x) for x in range(rows)])
    assert even.join(_doubled_outputs(even)) == expected
    assert balanced.join(_doubled_outputs(balanced)) == expected
    assert sum(u.pad for u in even.units) == -rows % len(slots)


@PROPERTY
@given(
    keys=st.lists(st.sampled_from("abcdefgh"), min_size=1, max_size=40),
    world=st.integers(1, 5),
)
def test_the_sticky_plan_routes_each_key_to_one_slot_and_joins_in_input_order(
    keys: list[str], world: int
) -> None:
    mode = make_sticky_dispatch_fn(lambda b: [r["k"] for r in b], max_lag=100)
    batch = Rows({"k": k, "i": i} for i, k in enumerate(keys))
    group = make_group(world)
    plan = mode["plan_fn"](group, batch)
    _check_partition(plan, len(keys))
    slot_of = {r: u.slot for u in plan.units for r in u.rows}
    for i, k in enumerate(keys):
        assert all(slot_of[j] == slot_of[i] for j, kk in enumerate(keys) if kk == k)
    assert plan.join(_identity_outputs(plan)) == batch
    again = mode["plan_fn"](group, batch)
    assert {r: u.slot for u in again.units for r in u.rows} == slot_of


def test_the_router_moves_keys_off_dead_and_lagging_slots_only() -> None:
    affinity = KeyAffinity(3, max_lag=1)
    first = affinity.assign("M", ["a", "b", "c"], [True, True, True])
    assert first == [0, 1, 2]
    for slot in range(3):
        affinity.release(slot, 1)
    # b's slot died: b goes to the least loaded live slot (2, as a took slot 0 first)
    assert affinity.assign("M", ["a", "b", "c"], [True, False, True]) == [0, 2, 2]
    assert affinity.moves == 1
    for slot, rows in ((0, 1), (2, 2)):
        affinity.release(slot, rows)
    assert affinity.outstanding == [0, 0, 0]
    affinity.outstanding[2] = 5  # slot 2 is five rows behind
    assert affinity.assign("M", ["c"], [True, True, True]) == [0]
    assert affinity.moves == 2
    with pytest.raises(DispatchArgumentError, match="no live slot"):
        affinity.assign("M", ["a"], [False, False, False])
    with pytest.raises(DispatchArgumentError, match="hashable"):
        affinity.assign("M", [["unhashable"]], [True, True, True])  # type: ignore[list-item]


def test_planned_calls_refuse_what_they_cannot_cut() -> None:
    slots = rank_slots(make_group(2))
    with pytest.raises(NotShardableError, match="at least one batch argument"):
        balanced_plan("BAL", slots, (3,), {}, None)
    with pytest.raises(DispatchArgumentError, match="empty batch"):
        balanced_plan("BAL", slots, (Rows(),), {}, None)
    with pytest.raises(DispatchArgumentError, match="same length"):
        balanced_plan("BAL", slots, (Rows([1, 2]), Rows([1])), {}, None)
    with pytest.raises(DispatchArgumentError, match="collect rank"):
        Slot((0, 1), 2)
    with pytest.raises(DispatchArgumentError, match="pinned to slot 3"):
        WorkPlan("P", slots, (WorkUnit(0, range(1), (Rows([1]),), {}, slot=3),), 1)
    two = tuple(WorkUnit(i, range(i, i + 1), (Rows([i]),), {}, slot=0) for i in range(2))
    with pytest.raises(DispatchArgumentError, match="another unit is pinned to already"):
        WorkPlan("P", slots, two, 2)
    with pytest.raises(DispatchModeTypeError, match="plan_fn must be callable"):
        DispatchModeSpec("X", 3)  # type: ignore[arg-type]
    sticky = make_sticky_dispatch_fn("sid")
    with pytest.raises(DispatchArgumentError, match="cannot read the routing key"):
        sticky["plan_fn"](make_group(2), Rows([1, 2]))


def test_a_custom_mapping_may_carry_a_plan() -> None:
    mode = make_sticky_dispatch_fn("sid", mesh_name="m")
    spec = resolve_dispatch_mode(mode)
    assert spec.row_aligned
    assert spec.plan_fn is mode["plan_fn"]
    assert spec.name == "sticky_dispatch_fn[sid, m]"
    batch = Rows({"sid": s} for s in "abcd")
    plan = mode["plan_fn"](make_group(4), batch)
    assert [s.ranks for s in plan.slots] == [(0, 1), (2, 3)]
    assert [s.collect_rank for s in plan.slots] == [0, 2]
