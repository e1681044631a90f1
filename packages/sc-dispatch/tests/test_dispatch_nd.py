"""N-d mesh dispatch: split by dp rank, collect from one rank per dp group."""

from __future__ import annotations

from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import Batch, FakeWorkerGroup, functions_of, per_rank, run_call
from sc_dispatch import MeshLayoutError, ext, make_nd_compute_dataproto_dispatch_fn, register
from sc_dispatch.ext import MeshLayout

# 4 ranks, dp=2 x tp=2; dp rank does NOT grow with global rank, and the collect rank of
# dp group 0 is the group's second member.
SCRAMBLED = ([1, 0, 0, 1], [True, False, True, False])


def tagged(rank: int, data: Batch) -> Batch:
    return Batch([(rank, row) for row in data.rows])


def test_mode_is_a_verl_style_mapping() -> None:
    fns = make_nd_compute_dataproto_dispatch_fn("actor")
    assert set(fns) == {"dispatch_fn", "collect_fn", "name", "row_aligned", "plan_fn"}
    spec = ext.resolve_dispatch_mode(fns)
    assert spec.name == "nd_dispatch_fn[actor]"
    assert functions_of(spec).unpad_output is True
    assert spec.row_aligned is True

    class W:
        @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
        def step(self, data: Batch) -> Batch:
            return data

    attrs = ext.get_register_attrs(W.step)
    assert attrs is not None
    assert isinstance(attrs.dispatch_mode, dict)


def test_every_rank_of_a_dp_group_gets_the_same_shard_object() -> None:
    wg = FakeWorkerGroup(4, {"m": SCRAMBLED})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    args, _, pad = per_rank(wg, fns, Batch([1, 2, 3, 4]))
    assert pad == 0
    shards = [a[0] for a in args]
    assert shards[1] is shards[2]  # dp 0
    assert shards[0] is shards[3]  # dp 1
    assert shards[1] is not shards[0]
    assert shards[1].rows == (1, 2)
    assert shards[0].rows == (3, 4)


def test_collects_in_dp_order_from_the_collect_ranks() -> None:
    wg = FakeWorkerGroup(4, {"m": SCRAMBLED})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    out = run_call(wg, fns, tagged, Batch([1, 2, 3, 4]))
    # dp 0 collected from rank 2, dp 1 from rank 0
    assert out == Batch([(2, 1), (2, 2), (0, 3), (0, 4)])


def test_keyword_only_calls() -> None:
    wg = FakeWorkerGroup(4, {"m": SCRAMBLED})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    ids = scd.Rows(["a", "b", "c", "d"])
    args, kwargs, _ = per_rank(wg, fns, data=Batch([1, 2, 3, 4]), ids=ids)
    assert args == [(), (), (), ()]
    assert [k["data"].rows for k in kwargs] == [(3, 4), (1, 2), (1, 2), (3, 4)]
    assert kwargs[1]["ids"] is kwargs[2]["ids"]
    out = run_call(
        wg,
        fns,
        lambda r, *, data, ids: Batch(list(zip(data.rows, ids, strict=True))),
        data=Batch([1, 2, 3, 4]),
        ids=ids,
    )
    assert out == Batch([(1, "a"), (2, "b"), (3, "c"), (4, "d")])


def test_pads_non_divisible_batches_like_dp_compute_proto() -> None:
    wg = FakeWorkerGroup(6, {"m": ([0, 0, 1, 1, 2, 2], [True, False] * 3)})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    batch = Batch([1, 2, 3, 4])
    args, _, pad = per_rank(wg, fns, batch)
    assert pad == 2
    flat = per_rank(FakeWorkerGroup(3), scd.Dispatch.DP_COMPUTE_PROTO, batch)
    assert [a[0].rows for a in args[::2]] == [a[0].rows for a in flat[0]]
    assert run_call(wg, fns, lambda r, d: d, batch) == batch
    assert batch.rows == (1, 2, 3, 4)


def test_without_padding_a_short_batch_is_an_error() -> None:
    wg = FakeWorkerGroup(4, {"m": ([0, 1, 2, 3], [True] * 4)})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    with pytest.raises(scd.DispatchArgumentError, match=r"mesh 'm'.*batch of 2 rows"):
        fns["dispatch_fn"](wg, Batch([1, 2], auto_pad=False))


@pytest.mark.parametrize(
    ("collect", "match"),
    [
        ([False, False, True, False], r"dp rank 1: collect ranks \[\]"),
        ([True, True, True, False], r"dp rank 0: collect ranks \[1, 2\]"),
        (
            [True, False, False, True],
            r"dp rank 0: collect ranks \[\], dp rank 1: collect ranks"
            r" \[0, 3\]",
        ),
    ],
)
def test_rejects_dp_groups_without_exactly_one_collect_rank(
    collect: list[bool], match: str
) -> None:
    wg = FakeWorkerGroup(4, {"m": (SCRAMBLED[0], collect)})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    with pytest.raises(MeshLayoutError, match=r"mesh 'm': every dp group needs exactly one"):
        fns["dispatch_fn"](wg, Batch([1, 2]))
    with pytest.raises(MeshLayoutError, match=match):
        fns["collect_fn"](wg, [Batch([1])] * 4)


def test_asks_the_worker_group_once_per_mesh() -> None:
    wg = FakeWorkerGroup(4, {"a": SCRAMBLED, "b": ([0, 1, 2, 3], [True] * 4)})
    fa = make_nd_compute_dataproto_dispatch_fn("a")
    fb = make_nd_compute_dataproto_dispatch_fn("b")
    for _ in range(3):
        run_call(wg, fa, tagged, Batch([1, 2, 3, 4]))
        run_call(wg, fb, tagged, Batch([1, 2, 3, 4]))
    run_call(wg, make_nd_compute_dataproto_dispatch_fn("a"), tagged, Batch([1, 2]))
    assert wg.mesh_queries == {"a": 1, "b": 1}
    assert {name: layout.dp_ranks for name, layout in wg.mesh_cache.items()} == {
        "a": (1, 0, 0, 1),
        "b": (0, 1, 2, 3),
    }
    assert wg.mesh_cache["a"].collect == (True, False, True, False)


def test_prefilled_cache_is_used_without_asking() -> None:
    wg = FakeWorkerGroup(2)
    wg.mesh_cache["m"] = MeshLayout((0, 0), (False, True))
    assert scd.ext.mesh_layout(wg, "m") == ([0, 0], [False, True])
    assert not wg.mesh_queries


def test_an_unregistered_mesh_names_the_mesh_and_is_not_cached() -> None:
    wg = FakeWorkerGroup(2, {"m": ([0, None], [True, None])})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    with pytest.raises(MeshLayoutError, match=r"ranks \[1\] did not register the mesh 'm'"):
        fns["dispatch_fn"](wg, Batch([1, 2]))
    with pytest.raises(MeshLayoutError, match=r"no rank registered the mesh 'x'"):
        scd.ext.mesh_layout(wg, "x")
    assert wg.mesh_cache == {}
    assert wg.mesh_queries == {"m": 1, "x": 1}


class _Unregistered(KeyError):
    """What sc-core's WorkerError for an unknown mesh carries: the failing ranks."""

    rank = 2
    other_failed_ranks = (0,)
    error_message = "mesh 'm' was never registered"


class _RaisingGroup:
    world_size = 4

    def query_mesh(self, mesh_name: str) -> MeshLayout:
        raise _Unregistered(mesh_name)


def test_a_key_error_from_query_mesh_is_a_mesh_layout_error_naming_the_ranks() -> None:
    with pytest.raises(MeshLayoutError) as info:
        scd.ext.mesh_layout(_RaisingGroup(), "m")
    text = str(info.value)
    assert "ranks [0, 2] did not register the mesh 'm'" in text
    assert "The worker said: mesh 'm' was never registered" in text
    assert isinstance(info.value.__cause__, _Unregistered)


def test_a_query_mesh_that_returns_something_else_is_an_error() -> None:
    class Wrong:
        world_size = 2

        def query_mesh(self, mesh_name: str) -> Any:
            return ([0, 1], [True, True])

    with pytest.raises(MeshLayoutError, match=r"Wrong.query_mesh must return a sc_dispatch.Mesh"):
        scd.ext.mesh_layout(Wrong(), "m")


def test_collect_needs_one_output_per_rank() -> None:
    wg = FakeWorkerGroup(4, {"m": SCRAMBLED})
    fns = make_nd_compute_dataproto_dispatch_fn("m")
    with pytest.raises(scd.DispatchArgumentError, match=r"mesh 'm': expected 4 outputs .*got 3"):
        fns["collect_fn"](wg, [Batch([1])] * 3)


def test_metric_style_custom_collect_can_reuse_the_layout() -> None:
    wg = FakeWorkerGroup(4, {"m": SCRAMBLED})
    dp_ranks, collect = ext.mesh_layout(wg, "m")
    outputs: list[Any] = ["r0", "r1", "r2", "r3"]
    picked = [o for o, flag in zip(outputs, collect, strict=True) if flag]
    assert (dp_ranks, picked) == ([1, 0, 0, 1], ["r0", "r2"])
