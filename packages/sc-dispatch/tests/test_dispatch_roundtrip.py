"""Property tests: split → collect → unpad gives the input back, for every splitting mode."""

from __future__ import annotations

from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import PROPERTY, Batch, FakeWorkerGroup, per_rank, run_call
from hypothesis import given
from hypothesis import strategies as st
from sc_dispatch import Dispatch

rows_st = st.lists(st.integers(-1000, 1000), max_size=40)


def identity(rank: int, data: Any) -> Any:
    return data


@PROPERTY
@given(rows=rows_st, world=st.integers(1, 9), auto_pad=st.booleans())
def test_dp_compute_proto_round_trip(rows: list[int], world: int, auto_pad: bool) -> None:
    wg = FakeWorkerGroup(world)
    batch = Batch(rows, auto_pad=auto_pad)
    if not rows or (len(rows) % world and not auto_pad):
        with pytest.raises(scd.DispatchArgumentError):
            run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, batch)
        return
    args, _, pad = per_rank(wg, Dispatch.DP_COMPUTE_PROTO, batch)
    sizes = [len(a[0]) for a in args]
    assert pad == (-len(rows)) % world
    assert len(set(sizes)) == 1  # exact: every rank gets the same number of rows
    assert run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, batch) == batch
    assert batch.rows == tuple(rows)


@PROPERTY
@given(rows=rows_st.filter(bool), world=st.integers(1, 9), as_tuple=st.booleans())
def test_rows_round_trip_and_plain_sequences_are_refused(
    rows: list[int], world: int, as_tuple: bool
) -> None:
    wg = FakeWorkerGroup(world)
    plain: list[int] | tuple[int, ...] = tuple(rows) if as_tuple else rows
    with pytest.raises(scd.NotShardableError, match="DP_COMPUTE"):
        run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, plain)
    data = scd.Rows(rows)
    if len(rows) % world:
        with pytest.raises(scd.DispatchArgumentError, match="does not divide evenly"):
            run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, data)
        return
    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, data)
    assert out == data
    assert type(out) is scd.Rows


@PROPERTY
@given(rows=rows_st.filter(bool), world=st.integers(1, 9))
def test_with_func_round_trip(rows: list[int], world: int) -> None:
    wg = FakeWorkerGroup(world)
    rows = rows * world  # divides evenly
    out = run_call(
        wg,
        Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
        lambda r, fn, d: Batch([fn(x) for x in d.rows]),
        abs,
        Batch(rows),
    )
    assert out == Batch([abs(x) for x in rows])


@PROPERTY
@given(rows=rows_st.filter(bool), world=st.integers(1, 9))
def test_metric_returns_one_value_per_worker(rows: list[int], world: int) -> None:
    wg = FakeWorkerGroup(world)
    # Batch pads by default: uneven rows are padded to a multiple of the world size.
    out = run_call(wg, Dispatch.DP_COMPUTE_METRIC, lambda r, d: (r, len(d)), Batch(rows))
    assert [r for r, _ in out] == list(range(world))
    assert {n for _, n in out} == {-(-len(rows) // world)}


@PROPERTY
@given(values=st.lists(st.integers(), min_size=1, max_size=9))
def test_dp_compute_round_trip(values: list[int]) -> None:
    wg = FakeWorkerGroup(len(values))
    assert run_call(wg, Dispatch.DP_COMPUTE, lambda r, v: v, values) == values
    assert run_call(wg, Dispatch.DP_COMPUTE, lambda r, v: v, tuple(values)) == values


@st.composite
def meshes(draw: st.DrawFn) -> tuple[list[int], list[bool]]:
    """A random dp x tp layout: ranks in random order, one random collect rank per group."""
    dp_size = draw(st.integers(1, 4))
    tp_size = draw(st.integers(1, 3))
    world = dp_size * tp_size
    order = draw(st.permutations(range(world)))
    dp_ranks = [order[r] // tp_size for r in range(world)]
    collect = [False] * world
    for dp in range(dp_size):
        members = [r for r in range(world) if dp_ranks[r] == dp]
        collect[draw(st.sampled_from(members))] = True
    return dp_ranks, collect


@PROPERTY
@given(layout=meshes(), rows=rows_st.filter(bool), auto_pad=st.booleans(), as_kw=st.booleans())
def test_nd_round_trip(
    layout: tuple[list[int], list[bool]], rows: list[int], auto_pad: bool, as_kw: bool
) -> None:
    dp_ranks, collect = layout
    world, dp_size = len(dp_ranks), max(dp_ranks) + 1
    wg = FakeWorkerGroup(world, {"mesh": layout})
    fns = scd.make_nd_compute_dataproto_dispatch_fn("mesh")
    batch = Batch(rows, auto_pad=auto_pad)
    call_args: tuple[Any, ...] = () if as_kw else (batch,)
    call_kwargs: dict[str, Any] = {"data": batch} if as_kw else {}
    if len(rows) % dp_size and not auto_pad:
        with pytest.raises(scd.DispatchArgumentError, match="does not divide evenly"):
            fns["dispatch_fn"](wg, *call_args, **call_kwargs)
        return
    args, kwargs, pad = per_rank(wg, fns, *call_args, **call_kwargs)
    received = [k["data"] for k in kwargs] if as_kw else [a[0] for a in args]
    for rank in range(world):
        for other in range(world):
            same_group = dp_ranks[rank] == dp_ranks[other]
            assert (received[rank] is received[other]) == same_group
    flat, _, flat_pad = per_rank(FakeWorkerGroup(dp_size), Dispatch.DP_COMPUTE_PROTO, batch)
    assert pad == flat_pad
    assert [received[r].rows for r in range(world)] == [flat[d][0].rows for d in dp_ranks]

    def worker(rank: int, *a: Any, **kw: Any) -> Batch:
        shard: Batch = kw["data"] if as_kw else a[0]
        return Batch([(dp_ranks[rank], row) for row in shard.rows])

    out = run_call(wg, fns, worker, *call_args, **call_kwargs)
    assert [row for _, row in out.rows] == rows
    dps = [dp for dp, _ in out.rows]
    assert dps == sorted(dps)
    assert wg.mesh_queries == {"mesh": 1}
    assert collect.count(True) == dp_size
