"""Every predefined mode, the registry, and the verl sharp edges that must not exist here."""

from __future__ import annotations

from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import (
    BATCH_ADAPTER,
    Batch,
    FakeWorkerGroup,
    functions_of,
    per_rank,
    run_call,
    unique_name,
)
from sc_dispatch import Dispatch, Execute, ext, verl
from sc_dispatch.ext import PADDING_SIZE_KEY


def echo(rank: int, *args: Any, **kwargs: Any) -> tuple[int, tuple[Any, ...], dict[str, Any]]:
    return rank, args, kwargs


def identity(rank: int, data: Any) -> Any:
    return data


# --- the predefined table -------------------------------------------------------------------

PREDEFINED = {
    "RANK_ZERO": (verl.dispatch_rank_zero, verl.collect_rank_zero, True),
    "ONE_TO_ALL": (verl.dispatch_one_to_all, verl.collect_all_to_all, True),
    "ALL_TO_ALL": (verl.dispatch_all_to_all, verl.collect_all_to_all, True),
    "DP_COMPUTE": (verl.dispatch_dp_compute, verl.collect_dp_compute, True),
    "DP_COMPUTE_PROTO": (
        verl.dispatch_dp_compute_data_proto,
        verl.collect_dp_compute_data_proto,
        True,
    ),
    "DP_COMPUTE_PROTO_WITH_FUNC": (
        verl.dispatch_dp_compute_data_proto_with_func,
        verl.collect_dp_compute_data_proto,
        True,
    ),
    "DP_COMPUTE_METRIC": (verl.dispatch_dp_compute_data_proto, verl.collect_dp_compute, False),
    "DIRECT_ROLLOUT_METHOD": (
        verl.dispatch_direct_rollout_method,
        verl.collect_direct_rollout_method,
        True,
    ),
}


@pytest.mark.parametrize("name", sorted(PREDEFINED))
def test_every_predefined_mode_is_registered(name: str) -> None:
    dispatch_fn, collect_fn, unpad = PREDEFINED[name]
    member = Dispatch.from_name(name)
    assert member is not None
    assert verl.get_predefined_dispatch_fn(member) == {
        "dispatch_fn": dispatch_fn,
        "collect_fn": collect_fn,
    }
    spec = scd.ext.resolve_dispatch_mode(member)
    assert (spec.name, spec.dispatch_fn, spec.collect_fn, functions_of(spec).unpad_output) == (
        name,
        dispatch_fn,
        collect_fn,
        unpad,
    )


def test_execute_fns() -> None:
    assert verl.get_predefined_execute_fn(Execute.ALL) == {"execute_fn_name": "execute_all"}
    assert verl.get_predefined_execute_fn(Execute.RANK_ZERO) == {
        "execute_fn_name": "execute_rank_zero"
    }
    name = unique_name("EXEC")
    member = Execute.register(name)
    try:
        with pytest.raises(scd.UnknownDispatchModeError, match=rf"<Execute.{name}: \d+>"):
            verl.get_predefined_execute_fn(member)
    finally:
        Execute.remove(name)


# --- each mode's behaviour ------------------------------------------------------------------


def test_rank_zero_has_a_working_pair() -> None:
    wg = FakeWorkerGroup(4)
    payload = {"k": 1}
    out = run_call(
        wg, Dispatch.RANK_ZERO, echo, payload, 2, execute_mode=Execute.RANK_ZERO, flag=True
    )
    assert out == (0, (payload, 2), {"flag": True})
    assert out[1][0] is payload


def test_one_to_all_sends_the_same_objects_to_every_rank() -> None:
    wg = FakeWorkerGroup(3)
    cfg = {"lr": 0.1}
    args, kwargs, pad = per_rank(wg, Dispatch.ONE_TO_ALL, cfg, step=[1, 2])
    assert pad == 0
    assert all(a[0] is cfg for a in args)
    assert [k["step"] for k in kwargs] == [[1, 2]] * 3
    out = run_call(wg, Dispatch.ONE_TO_ALL, lambda r, c: (r, c["lr"]), cfg)
    assert out == [(0, 0.1), (1, 0.1), (2, 0.1)]


def test_all_to_all_passes_arguments_through() -> None:
    wg = FakeWorkerGroup(2)
    marker = object()
    d_args, d_kwargs = verl.dispatch_all_to_all(wg, marker, k=marker)
    assert d_args == (marker,)
    assert d_kwargs == {"k": marker}
    assert run_call(wg, Dispatch.ALL_TO_ALL, lambda r, v: (r, v), ["a", "b"]) == [
        (0, "a"),
        (1, "b"),
    ]
    outs = ["x", "y"]
    assert verl.collect_all_to_all(wg, outs) is outs


@pytest.mark.parametrize("kind", [list, tuple])
def test_dp_compute_splits_lists_and_tuples_alike(kind: type[Any]) -> None:
    wg = FakeWorkerGroup(3)
    args, kwargs, pad = per_rank(
        wg, Dispatch.DP_COMPUTE, kind(["a", "b", "c"]), seed=kind([10, 11, 12])
    )
    assert pad == 0
    assert args == [("a",), ("b",), ("c",)]
    assert kwargs == [{"seed": 10}, {"seed": 11}, {"seed": 12}]
    out = run_call(
        wg,
        Dispatch.DP_COMPUTE,
        lambda r, x, seed: f"{r}:{x}:{seed}",
        kind(["a", "b", "c"]),
        seed=kind([10, 11, 12]),
    )
    assert out == ["0:a:10", "1:b:11", "2:c:12"]


def test_dp_compute_entries_are_not_split_further() -> None:
    wg = FakeWorkerGroup(2)
    args, _, _ = per_rank(wg, Dispatch.DP_COMPUTE, [[1, 2, 3], [4]])
    assert args == [([1, 2, 3],), ([4],)]


def test_dp_compute_proto_splits_rows_and_joins_in_rank_order() -> None:
    wg = FakeWorkerGroup(3)
    args, kwargs, pad = per_rank(
        wg, Dispatch.DP_COMPUTE_PROTO, scd.Rows(range(9)), mask=scd.Rows("abcdefghi")
    )
    assert pad == 0
    assert [a[0] for a in args] == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    assert [k["mask"] for k in kwargs] == [["a", "b", "c"], ["d", "e", "f"], ["g", "h", "i"]]
    out = run_call(
        wg, Dispatch.DP_COMPUTE_PROTO, lambda r, d: scd.Rows(x * 10 for x in d), scd.Rows(range(9))
    )
    assert out == [x * 10 for x in range(9)]
    assert type(out) is scd.Rows


def test_dp_compute_proto_pads_and_unpads_a_batch() -> None:
    wg = FakeWorkerGroup(4)
    batch = Batch([1, 2, 3, 4, 5])
    args, _, pad = per_rank(wg, Dispatch.DP_COMPUTE_PROTO, batch)
    assert pad == 3
    assert [a[0].rows for a in args] == [(1, 2), (3, 4), (5, 1), (2, 3)]
    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, batch)
    assert out == batch
    assert out is not batch


def test_padding_pads_every_argument_of_the_call() -> None:
    wg = FakeWorkerGroup(2)
    _, kwargs, pad = per_rank(
        wg, Dispatch.DP_COMPUTE_PROTO, Batch([1, 2, 3]), ids=scd.Rows(["a", "b", "c"])
    )
    assert pad == 1
    assert [k["ids"] for k in kwargs] == [["a", "b"], ["c", "a"]]


def test_padding_size_travels_in_kwargs_and_is_popped() -> None:
    wg = FakeWorkerGroup(2)
    _, d_kwargs = verl.dispatch_dp_compute_data_proto(wg, Batch([1, 2, 3]))
    assert d_kwargs == {PADDING_SIZE_KEY: 1}
    assert ext.pop_padding_size(d_kwargs) == 1
    assert d_kwargs == {}
    assert ext.pop_padding_size(d_kwargs) == 0
    _, even_kwargs = verl.dispatch_dp_compute_data_proto(wg, Batch([1, 2]))
    assert PADDING_SIZE_KEY not in even_kwargs


def test_auto_padding_never_mutates_the_callers_object() -> None:
    wg = FakeWorkerGroup(4)
    batch = Batch([1, 2, 3, 4, 5])
    rows_before = batch.rows
    calls_before = len(BATCH_ADAPTER.pad_calls)
    run_call(wg, Dispatch.DP_COMPUTE_PROTO, identity, batch)
    assert BATCH_ADAPTER.pad_calls[calls_before:] == [(5, 3)]
    assert batch.rows is rows_before
    assert len(batch) == 5
    plain = scd.Rows([1, 2, 3])
    _, kwargs, _ = per_rank(wg, Dispatch.DP_COMPUTE_PROTO, Batch([7, 8, 9]), extra=plain)
    assert plain == [1, 2, 3]
    assert sum(len(k["extra"]) for k in kwargs) == 4


def test_dp_compute_proto_with_func() -> None:
    wg = FakeWorkerGroup(2)

    def double(x: int) -> int:
        return 2 * x

    args, kwargs, pad = per_rank(
        wg,
        Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
        double,
        scd.Rows([1, 2, 3, 4]),
        tag=scd.Rows("abcd"),
    )
    assert pad == 0
    assert all(a[0] is double for a in args)
    assert [a[1] for a in args] == [[1, 2], [3, 4]]
    assert [k["tag"] for k in kwargs] == [["a", "b"], ["c", "d"]]
    out = run_call(
        wg,
        Dispatch.DP_COMPUTE_PROTO_WITH_FUNC,
        lambda r, fn, data: Batch([fn(x) for x in data.rows]),
        double,
        Batch([1, 2, 3]),
    )
    assert out == Batch([2, 4, 6])


def test_dp_compute_metric_with_padding_keeps_every_workers_result() -> None:
    wg = FakeWorkerGroup(4)
    assert functions_of(Dispatch.DP_COMPUTE_METRIC).unpad_output is False
    # 5 rows on 4 workers: 3 padding rows; every worker reports one metric.
    out = run_call(
        wg,
        Dispatch.DP_COMPUTE_METRIC,
        lambda r, d: {"rank": r, "rows": len(d)},
        Batch([1, 2, 3, 4, 5]),
    )
    assert out == [{"rank": r, "rows": 2} for r in range(4)]


def test_dp_compute_metric_outputs_that_are_lists_are_not_truncated() -> None:
    wg = FakeWorkerGroup(2)
    out = run_call(wg, Dispatch.DP_COMPUTE_METRIC, lambda r, d: [r], Batch([1, 2, 3]))
    assert out == [[0], [1]]


def test_collect_dp_compute_proto_joins_tuples_and_batches() -> None:
    wg = FakeWorkerGroup(2)
    assert verl.collect_dp_compute_data_proto(wg, [(1, 2), (3,)]) == (1, 2, 3)
    assert verl.collect_dp_compute_data_proto(wg, [Batch([1]), Batch([2])]) == Batch([1, 2])
    assert ext.concat_outputs("X", [[1], [2, 3]]) == [1, 2, 3]


def test_splitting_with_no_arguments_calls_every_rank() -> None:
    wg = FakeWorkerGroup(3)
    assert verl.dispatch_dp_compute_data_proto(wg) == ([], {})
    assert run_call(wg, Dispatch.DP_COMPUTE, lambda r: r) == [0, 1, 2]


# --- registering and updating modes ---------------------------------------------------------


def _split_evens(worker_group: Any, data: list[int]) -> tuple[tuple[list[Any]], dict[str, Any]]:
    n = worker_group.world_size
    return ([data[r::n] for r in range(n)],), {}


def _join(worker_group: Any, output: Any) -> list[int]:
    return sorted(x for part in output for x in part)


def test_register_dispatch_mode_adds_a_member_and_works() -> None:
    name = unique_name("STRIDED")
    member = scd.register_dispatch_mode(name, _split_evens, _join)
    try:
        assert member is Dispatch.from_name(name)
        assert getattr(Dispatch, name) is member
        assert verl.get_predefined_dispatch_fn(member) == {
            "dispatch_fn": _split_evens,
            "collect_fn": _join,
        }
        wg = FakeWorkerGroup(3)
        args, _, _ = per_rank(wg, member, list(range(7)))
        assert [a[0] for a in args] == [[0, 3, 6], [1, 4], [2, 5]]
        assert run_call(wg, member, lambda r, d: [x + 100 for x in d], list(range(7))) == [
            100 + x for x in range(7)
        ]
        assert functions_of(member).unpad_output is True
    finally:
        Dispatch.remove(name)


def test_register_dispatch_mode_unpad_flag() -> None:
    name = unique_name()
    member = scd.register_dispatch_mode(name, _split_evens, _join, unpad_output=False)
    try:
        assert functions_of(member).unpad_output is False
    finally:
        Dispatch.remove(name)


def test_update_dispatch_mode_replaces_functions_and_keeps_flag() -> None:
    name = unique_name()
    member = scd.register_dispatch_mode(name, _split_evens, _join, unpad_output=False)
    try:
        scd.update_dispatch_mode(member, scd.verl.dispatch_one_to_all, scd.verl.collect_all_to_all)
        spec = scd.ext.resolve_dispatch_mode(member)
        assert (spec.name, spec.dispatch_fn, spec.collect_fn, functions_of(spec).unpad_output) == (
            name,
            verl.dispatch_one_to_all,
            verl.collect_all_to_all,
            False,
        )
        scd.update_dispatch_mode(member, _split_evens, _join, unpad_output=True)
        assert functions_of(member).unpad_output is True
        with pytest.raises(scd.DispatchModeTypeError, match=rf"{name}: collect_fn .* None"):
            scd.update_dispatch_mode(member, _split_evens, None)  # type: ignore[arg-type]
        assert ext.resolve_dispatch_mode(member).collect_fn is _join
    finally:
        Dispatch.remove(name)


def test_update_predefined_mode_and_restore() -> None:
    original = verl.get_predefined_dispatch_fn(Dispatch.ALL_TO_ALL)
    try:
        scd.update_dispatch_mode(Dispatch.ALL_TO_ALL, _split_evens, _join)
        assert verl.get_predefined_dispatch_fn(Dispatch.ALL_TO_ALL)["collect_fn"] is _join
    finally:
        scd.update_dispatch_mode(
            Dispatch.ALL_TO_ALL, original["dispatch_fn"], original["collect_fn"]
        )
    assert verl.get_predefined_dispatch_fn(Dispatch.ALL_TO_ALL) == original


def test_failed_registration_leaves_no_member() -> None:
    name = unique_name()
    with pytest.raises(scd.DispatchModeTypeError):
        scd.register_dispatch_mode(name, _split_evens, "nope")  # type: ignore[arg-type]
    assert name not in Dispatch


def test_worker_group_fake_meets_the_protocol() -> None:
    assert isinstance(FakeWorkerGroup(1), ext.DispatchWorkerGroup)
    assert not isinstance(object(), ext.DispatchWorkerGroup)
