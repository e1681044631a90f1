"""Pipeline stages on an N-d mesh: ranks registered with ``receives_data=False`` (middle
stages) get their dp shard's metadata-only form, the others the shard itself; outputs are
still collected from the collect ranks in dp order; bad layouts are refused."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from _dispatch_fakes import Batch, per_rank, run_call
from sc_dispatch import (
    DispatchArgumentError,
    Execute,
    MeshLayoutError,
    Rows,
    make_balanced_dispatch_fn,
    make_nd_compute_dataproto_dispatch_fn,
    make_sticky_dispatch_fn,
)
from sc_dispatch.ext import (
    MeshLayout,
    Slot,
    WorkPlan,
    WorkUnit,
    ask_mesh_layout,
    chunk_sizes,
    mesh_slots,
    register_nbytes,
    register_shardable,
    resolve_dispatch_mode,
)
from sc_dispatch.testing import FakeWorkerGroup


class StageBatch:
    """Rows plus batch-level ``meta``; ``rows is None`` is the metadata-only form, which
    keeps the row count in ``n``."""

    def __init__(self, rows: Sequence[Any] | None, meta: dict[str, Any], n: int = -1) -> None:
        self.rows = None if rows is None else tuple(rows)
        self.meta = meta
        self.n = len(self.rows) if self.rows is not None else n

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StageBatch) and (other.rows, other.n) == (self.rows, self.n)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"StageBatch({self.rows!r}, n={self.n})"


class StageAdapter:
    def __init__(self) -> None:
        self.stripped = 0

    def length(self, obj: StageBatch) -> int:
        return obj.n

    def chunk(self, obj: StageBatch, chunks: int) -> list[StageBatch]:
        rows = obj.rows or ()
        parts, start = [], 0
        for size in chunk_sizes(len(rows), chunks):
            parts.append(StageBatch(rows[start : start + size], dict(obj.meta)))
            start += size
        return parts

    def concat(self, parts: Sequence[StageBatch]) -> StageBatch:
        return StageBatch([r for p in parts for r in (p.rows or ())], dict(parts[0].meta))

    def pad(self, obj: StageBatch, pad_size: int) -> StageBatch:
        rows = obj.rows or ()
        return StageBatch([*rows, *(rows[i % len(rows)] for i in range(pad_size))], obj.meta)

    def unpad(self, obj: StageBatch, pad_size: int) -> StageBatch:
        rows = obj.rows or ()
        return StageBatch(rows[: len(rows) - pad_size], obj.meta)

    def auto_padding(self, obj: StageBatch) -> bool:
        return True

    def take(self, obj: StageBatch, positions: Sequence[int]) -> StageBatch:
        rows = obj.rows or ()
        return StageBatch([rows[i] for i in positions], dict(obj.meta))

    def metadata_only(self, obj: StageBatch) -> StageBatch:
        self.stripped += 1
        return StageBatch(None, dict(obj.meta), obj.n)


ADAPTER = StageAdapter()
register_shardable(StageBatch, ADAPTER)
register_nbytes(StageBatch, lambda b: 8 * len(b.rows or ()))

# 2 pipeline stages x 2 dp, tp 1 (pp slowest): ranks 0, 1 are stage 0 of dp 0, 1; ranks
# 2, 3 stage 1. Both stages read the batch; the last stage collects.
PP2 = ((0, 1, 0, 1), (False, False, True, True), (True, True, True, True))
# 4 stages x 2 dp: stages 0 and 3 read the batch, stages 1 and 2 get metadata only.
PP4_DP = (0, 1) * 4
PP4_COLLECT = (False,) * 6 + (True, True)
PP4_RECEIVES = (True, True, False, False, False, False, True, True)
PP4 = (PP4_DP, PP4_COLLECT, PP4_RECEIVES)


def stage_layout() -> FakeWorkerGroup:
    return FakeWorkerGroup(8, {"actor": PP4})


def tagged(rank: int, data: StageBatch) -> StageBatch:
    return StageBatch([(rank, r) for r in (data.rows or ["meta"] * data.n)], data.meta)


def test_the_layout_keeps_the_flags_and_names_the_data_ranks() -> None:
    layout = MeshLayout(PP4_DP, PP4_COLLECT, receives_data=PP4_RECEIVES)
    assert layout.receives_data == PP4_RECEIVES
    assert layout.data_ranks == ((0, 6), (1, 7))
    assert layout.collect_ranks == (6, 7)
    # the default is every rank, stored as flags: equal to the explicit layout
    plain = MeshLayout((0, 1), (True, True))
    assert plain.receives_data == (True, True)
    assert plain == MeshLayout((0, 1), (True, True), receives_data=[True, True])  # type: ignore[arg-type]


def test_the_nd_plan_gives_middle_stages_one_shared_metadata_object() -> None:
    group = stage_layout()
    batch = StageBatch(range(8), {"temperature": 0.7})
    spec = resolve_dispatch_mode(make_nd_compute_dataproto_dispatch_fn("actor"))
    plan = spec.plan(group, Execute.ALL, (batch,), {})
    assert [s.data_ranks for s in plan.slots] == [(0, 6), (1, 7)]
    got: dict[int, Any] = {}
    for unit in plan.units:
        assert unit.slot is not None
        for rank, (args, _) in zip(
            plan.slots[unit.slot].ranks, plan.rank_arguments(unit, unit.slot), strict=True
        ):
            got[rank] = args[0]
    assert got[0].rows == (0, 1, 2, 3)
    assert got[6] is got[0]
    assert got[1].rows == (4, 5, 6, 7)
    assert got[7] is got[1]
    middle = [got[r] for r in (2, 3, 4, 5)]
    assert all(m.rows is None and m.n == 4 and m.meta == {"temperature": 0.7} for m in middle)
    # the shards of one batch share their metadata: one object for every middle rank
    assert all(m is middle[0] for m in middle)
    assert plan.rank_nbytes() == {0: 32, 6: 32, 1: 32, 7: 32, 2: 0, 3: 0, 4: 0, 5: 0}


def test_outputs_collect_from_the_collect_ranks_in_dp_order() -> None:
    group = stage_layout()
    fns = make_nd_compute_dataproto_dispatch_fn("actor")
    seen: dict[int, StageBatch] = {}

    def worker(rank: int, data: StageBatch) -> StageBatch:
        seen[rank] = data
        return tagged(rank, data)

    out = run_call(group, fns, worker, StageBatch(range(6), {"k": 1}))
    assert out.rows == ((6, 0), (6, 1), (6, 2), (7, 3), (7, 4), (7, 5))
    assert [seen[r].rows for r in (0, 6)] == [(0, 1, 2)] * 2
    assert [seen[r].rows for r in (1, 7)] == [(3, 4, 5)] * 2
    assert {seen[r].n for r in (2, 3, 4, 5)} == {3}
    assert all(seen[r].rows is None for r in (2, 3, 4, 5))
    assert seen[2] is seen[5]


def test_padding_keeps_the_padded_row_count_in_the_metadata_form() -> None:
    group = stage_layout()
    fns = make_nd_compute_dataproto_dispatch_fn("actor")
    args, _, pad = per_rank(group, fns, StageBatch(range(5), {}))
    assert pad == 1
    assert [a[0].n for a in args] == [3] * 8
    assert args[2][0].rows is None
    assert args[0][0].rows == (0, 1, 2)
    out = run_call(group, fns, lambda r, d: d, StageBatch(range(5), {}))
    assert out.rows == (0, 1, 2, 3, 4)


def test_verl_dispatch_fn_strips_once_per_argument_and_row_count() -> None:
    group = stage_layout()
    fns = make_nd_compute_dataproto_dispatch_fn("actor")
    before = ADAPTER.stripped
    args, kwargs, _ = per_rank(
        group, fns, StageBatch(range(4), {"a": 1}), other=StageBatch(range(4), {"b": 2})
    )
    assert ADAPTER.stripped - before == 2  # one per argument, shared by dp groups and stages
    assert args[2][0] is args[5][0]
    assert args[2][0].meta == {"a": 1}
    assert kwargs[3]["other"] is kwargs[4]["other"]
    assert kwargs[3]["other"].meta == {"b": 2}
    assert kwargs[6]["other"].rows == (0, 1)


def test_arguments_without_a_metadata_form_reach_every_rank_unchanged() -> None:
    group = stage_layout()
    fns = make_nd_compute_dataproto_dispatch_fn("actor")
    ids = Rows(["a", "b", "c", "d"])
    args, _, _ = per_rank(group, fns, StageBatch(range(4), {}), ids)
    assert [a[1] for a in args] == [Rows(["a", "b"]), Rows(["c", "d"])] * 4
    assert args[2][1] is args[0][1]  # the shard itself, shared as before
    spec = resolve_dispatch_mode(fns)
    plan = spec.plan(group, Execute.ALL, (Batch([1, 2, 3, 4]),), {})
    shard = plan.units[0].args[0]
    assert [a[0] for a, _ in plan.rank_arguments(plan.units[0], 0)] == [shard] * 4


def test_a_layout_where_every_rank_receives_plans_as_before() -> None:
    group = FakeWorkerGroup(4, {"m": PP2})
    assert [s.data_ranks for s in mesh_slots(group, "m")] == [None, None]
    plan = resolve_dispatch_mode(make_nd_compute_dataproto_dispatch_fn("m")).plan(
        group, Execute.ALL, (StageBatch(range(4), {}),), {}
    )
    first = plan.rank_arguments(plan.units[0], 0)
    assert first[0] is first[1]


@pytest.mark.parametrize(
    "mode",
    [
        make_balanced_dispatch_fn(2, mesh_name="actor"),
        make_sticky_dispatch_fn(lambda b: [r % 3 for r in b.rows], mesh_name="actor"),
    ],
)
def test_the_balanced_and_sticky_modes_on_the_mesh_strip_too(mode: Any) -> None:
    group = stage_layout()
    seen: dict[int, list[StageBatch]] = {}

    def worker(rank: int, data: StageBatch) -> StageBatch:
        seen.setdefault(rank, []).append(data)
        return StageBatch(data.rows or (), data.meta) if data.rows is not None else data

    batch = StageBatch(range(8), {"k": 1})
    out = run_call(group, mode, worker, batch)
    assert out.rows == tuple(range(8))
    for rank in (2, 3, 4, 5):
        assert all(d.rows is None and d.n > 0 for d in seen.get(rank, []))
    assert sum(len(d.rows or ()) for r in (6, 7) for d in seen.get(r, [])) == 8


def test_a_dp_group_without_a_receiving_rank_is_refused_naming_the_mesh_and_the_dp_rank() -> None:
    receives = (True, False, False, False, False, False, True, False)
    with pytest.raises(MeshLayoutError) as info:
        MeshLayout(PP4_DP, PP4_COLLECT, mesh_name="actor", receives_data=receives)
    text = str(info.value)
    assert "mesh 'actor': every dp group needs at least one rank that receives the data" in text
    assert "dp rank 1: ranks [1, 3, 5, 7] all registered receives_data=False" in text
    group = FakeWorkerGroup(8, {"actor": (PP4_DP, PP4_COLLECT, receives)})
    with pytest.raises(MeshLayoutError, match=r"mesh 'actor'.*dp rank 1"):
        make_nd_compute_dataproto_dispatch_fn("actor")["dispatch_fn"](
            group, StageBatch(range(4), {})
        )
    assert group.mesh_cache == {}  # nothing invalid is cached


@pytest.mark.parametrize(
    ("receives", "match"),
    [
        ((True, 1), r"receives-data flags must be bools; got \(rank: value\) \{1: 1\}"),
        ((True,), r"expected one receives-data flag per dp rank, got 2 dp ranks and 1"),
    ],
)
def test_bad_receives_data_flags_are_refused(receives: tuple[Any, ...], match: str) -> None:
    with pytest.raises(MeshLayoutError, match=match):
        MeshLayout((0, 0), (True, False), mesh_name="m", receives_data=receives)


def test_ask_mesh_layout_reads_the_third_query_and_names_unregistered_ranks() -> None:
    layout = ask_mesh_layout(
        "m", 2, lambda _: [0, 0], lambda _: [False, True], lambda _: [False, True]
    )
    assert layout.receives_data == (False, True)
    assert layout.data_ranks == ((1,),)
    with pytest.raises(MeshLayoutError, match=r"ranks \[0\] did not register the mesh 'm'"):
        ask_mesh_layout("m", 2, lambda _: [0, 0], lambda _: [False, True], lambda _: [None, True])
    with pytest.raises(MeshLayoutError, match=r"one receives-data flag per rank .* got 1"):
        ask_mesh_layout("m", 2, lambda _: [0, 0], lambda _: [False, True], lambda _: [True])
    # without the third query (verl's two), every rank receives
    assert ask_mesh_layout("m", 1, lambda _: [0], lambda _: [True]).receives_data == (True,)


def test_a_slot_checks_its_data_ranks() -> None:
    assert Slot((0, 1), 1, (0,)).data_ranks == (0,)
    for data in ((), (2,)):
        with pytest.raises(DispatchArgumentError, match="data ranks among its ranks"):
            Slot((0, 1), 1, data)


class _Shrinking(StageAdapter):
    def metadata_only(self, obj: StageBatch) -> StageBatch:
        return StageBatch(None, obj.meta, obj.n - 1)


class Shrinks(StageBatch):
    pass


register_shardable(Shrinks, _Shrinking())


def test_a_metadata_form_that_changes_the_row_count_is_an_error() -> None:
    slot = Slot((0, 1), 1, (1,))
    unit = WorkUnit(0, range(2), (Shrinks([1, 2], {}),), {}, slot=0)
    plan = WorkPlan("M", (slot,), (unit,), 2)
    with pytest.raises(DispatchArgumentError, match=r"M: the metadata_only form of a Shrinks"):
        plan.rank_arguments(unit, 0)
