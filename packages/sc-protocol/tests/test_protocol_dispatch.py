"""DataProto, TensorDict and DataProtoFuture through sc-dispatch's splitting modes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from _protocol_helpers import make_dp, row_ids
from sc_dispatch import (
    Dispatch,
    DispatchArgumentError,
    Execute,
    make_nd_compute_dataproto_dispatch_fn,
    register,
)
from sc_dispatch.ext import (
    MeshLayout,
    get_shard_adapter,
    is_future,
    materialize,
    payload_nbytes,
    resolve_dispatch_mode,
    split_args_kwargs,
    unpad_output,
)
from sc_dispatch.testing import FakeWorkerGroup
from sc_dispatch.verl import (
    collect_dp_compute_data_proto,
    dispatch_dp_compute_data_proto,
    dispatch_dp_compute_data_proto_with_func,
)
from sc_protocol import DataProto, DataProtoConfig, DataProtoFuture
from sc_protocol.ext import DataProtoAdapter, DataProtoFutureAdapter, TensorDictAdapter
from tensordict import TensorDict, TensorDictBase


def run_call(
    wg: FakeWorkerGroup, mode: Any, fn: Callable[..., Any], *args: Any, **kwargs: Any
) -> Any:
    """Plan the call, run ``fn`` once per rank of each unit's slot (as a worker would,
    futures materialized), and join the collect ranks' outputs."""
    spec = resolve_dispatch_mode(mode)
    plan = spec.plan(wg, Execute.ALL, args, kwargs)
    outputs = []
    for unit in plan.units:
        slot = plan.slots[unit.slot or 0]
        ran = {}
        for rank in slot.ranks:
            rank_args, rank_kwargs = materialize(unit.args, unit.kwargs)
            ran[rank] = fn(*rank_args, **rank_kwargs)
        outputs.append(ran[slot.collect_rank])
    return plan.join(outputs)


def double_ids(data: DataProto) -> DataProto:
    assert data.batch is not None
    return DataProto.from_dict(
        {"ids": data.batch["ids"] * 2}, {"uid": data.non_tensor_batch["uid"]}
    )


def test_adapters_registered_on_import() -> None:
    assert isinstance(get_shard_adapter(make_dp(1)), DataProtoAdapter)
    assert isinstance(get_shard_adapter(TensorDict({}, batch_size=[1])), TensorDictAdapter)
    assert isinstance(get_shard_adapter(DataProtoFuture()), DataProtoFutureAdapter)
    assert is_future(DataProtoFuture())


def test_dataproto_split_is_exact() -> None:
    split, _, pad = split_args_kwargs("DP_COMPUTE_PROTO", 3, [make_dp(6)], {})
    assert pad == 0
    assert [row_ids(p) for p in split[0]] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(DispatchArgumentError, match=r"7 rows does not divide evenly into 3"):
        split_args_kwargs("DP_COMPUTE_PROTO", 3, [make_dp(7)], {})


@pytest.mark.parametrize("rows", [7, 8, 2])
def test_the_dataproto_adapter_cuts_array_split_sizes(rows: int) -> None:
    # The ShardAdapter contract (the load-balanced mode cuts micro-shards with it), while
    # DataProto.chunk itself stays exact, as in verl.
    data = make_dp(rows)
    parts = DataProtoAdapter().chunk(data, 3)
    base, extra = divmod(rows, 3)
    assert [len(p) for p in parts] == [base + (i < extra) for i in range(3)]
    assert [r for p in parts for r in row_ids(p)] == list(range(rows))
    uids = [u for p in parts for u in p.non_tensor_batch["uid"]]
    assert uids == [f"u{i}" for i in range(rows)]


def test_dp_compute_proto_roundtrip() -> None:
    wg = FakeWorkerGroup(4)
    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, double_ids, make_dp(8))
    assert out.batch["ids"][:, 0].tolist() == [i * 6 for i in range(8)]


def test_auto_padding_via_dataproto_does_not_mutate_caller() -> None:
    wg = FakeWorkerGroup(4)
    dp = make_dp(6, meta={DataProtoConfig.auto_padding_key: True})
    args, kwargs = dispatch_dp_compute_data_proto(wg, dp)
    assert kwargs["_sc_padding_size"] == 2
    assert [len(p) for p in args[0]] == [2, 2, 2, 2]
    assert row_ids(args[0][3]) == [0, 1]  # padding repeats rows from the start
    assert len(dp) == 6
    assert row_ids(dp) == list(range(6))
    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, double_ids, dp)
    assert len(out) == 6
    assert list(out.non_tensor_batch["uid"]) == [f"u{i}" for i in range(6)]


def test_global_auto_padding_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    wg = FakeWorkerGroup(4)
    with pytest.raises(DispatchArgumentError, match=r"3 rows does not divide evenly into 4"):
        dispatch_dp_compute_data_proto(wg, make_dp(3))
    monkeypatch.setenv("SC_PROTOCOL_AUTO_PADDING", "1")
    args, kwargs = dispatch_dp_compute_data_proto(wg, make_dp(3))
    assert kwargs["_sc_padding_size"] == 1
    assert len(args[0]) == 4


def test_tensordict_through_dispatch_and_collect() -> None:
    wg = FakeWorkerGroup(3)
    td = TensorDict({"x": torch.arange(9), "n": {"y": torch.arange(9) * 10}}, batch_size=[9])

    def inc(t: TensorDictBase) -> TensorDictBase:
        out = t.clone()
        out["x"] = out["x"] + 1
        return out

    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, inc, td)
    assert out["x"].tolist() == list(range(1, 10))
    assert out["n", "y"].tolist() == [i * 10 for i in range(9)]


def test_tensordict_with_jagged_tensor_and_padding() -> None:
    DataProtoConfig.auto_padding = True
    wg = FakeWorkerGroup(2)
    nt = torch.nested.nested_tensor([torch.ones(i + 1) for i in range(3)], layout=torch.jagged)
    td = TensorDict({"j": nt, "x": torch.arange(3)}, batch_size=[3])
    args, kwargs = dispatch_dp_compute_data_proto(wg, td)
    assert kwargs["_sc_padding_size"] == 1
    assert [p["x"].tolist() for p in args[0]] == [[0, 1], [2, 0]]
    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, lambda t: t, td)
    assert out["x"].tolist() == [0, 1, 2]
    assert [t.numel() for t in out["j"].unbind()] == [1, 2, 3]
    assert td.batch_size == torch.Size([3])


def test_tensordict_adapter_errors() -> None:
    adapter = TensorDictAdapter()
    with pytest.raises(ValueError, match=r"batch_size=\[\] has no rows"):
        adapter.length(TensorDict({}, batch_size=[]))
    with pytest.raises(ValueError, match=r"empty list"):
        adapter.concat([])
    with pytest.raises(ValueError, match=r"cannot pad an empty TensorDict with 1 rows"):
        adapter.pad(TensorDict({}, batch_size=[0]), 1)
    with pytest.raises(ValueError, match=r"cannot drop 3 padding rows from a TensorDict of 2"):
        adapter.unpad(TensorDict({}, batch_size=[2]), 3)
    td = TensorDict({"x": torch.arange(2)}, batch_size=[2])
    assert adapter.pad(td, 0) is td
    assert adapter.concat([td]) is td
    dp_adapter = DataProtoAdapter()
    dp = make_dp(0)
    with pytest.raises(ValueError, match=r"cannot pad an empty DataProto with 1 rows"):
        dp_adapter.pad(dp, 1)
    assert dp_adapter.pad(dp, 0) is dp


def test_future_through_dispatch_known_counts() -> None:
    wg = FakeWorkerGroup(2)
    dp = make_dp(6)
    fetched: list[list[Any]] = []

    def resolve(refs: list[Any]) -> list[DataProto]:
        fetched.append(list(refs))
        return [{"a": dp[:3], "b": dp[3:]}[r] for r in refs]

    fut = DataProtoFuture.from_shards(["a", "b"], [3, 3], resolve)
    args, _ = dispatch_dp_compute_data_proto(wg, fut)
    assert [p.shard_refs for p in args[0]] == [("a",), ("b",)]

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def worker_fn(data: DataProto) -> DataProto:
        assert isinstance(data, DataProto)  # materialized before the body runs
        return double_ids(data)

    out = run_call(wg, Dispatch.DP_COMPUTE_PROTO, worker_fn, fut)
    assert out.batch["ids"][:, 0].tolist() == [i * 6 for i in range(6)]
    assert sorted(map(tuple, fetched)) == [("a",), ("b",)]  # one fetch per rank, own shard


def test_future_redistributed_to_a_larger_group_fetches_overlaps_only() -> None:
    dp = make_dp(6)
    fut = DataProtoFuture.from_shards([dp[:3], dp[3:]], [3, 3])
    args, _ = dispatch_dp_compute_data_proto(FakeWorkerGroup(3), fut)
    assert [p.row_counts for p in args[0]] == [(3,), (3, 3), (3,)]
    assert [row_ids(p.get()) for p in args[0]] == [[0, 1], [2, 3], [4, 5]]


def test_future_with_unknown_counts_follows_the_dataproto() -> None:
    wg = FakeWorkerGroup(4)
    dp = make_dp(6, meta={DataProtoConfig.auto_padding_key: True})
    other = make_dp(6)
    fut = DataProtoFuture.from_shards([other[:2], other[2:]])
    args, kwargs = dispatch_dp_compute_data_proto(wg, dp, fut)
    assert kwargs["_sc_padding_size"] == 2
    assert [row_ids(p.get()) for p in args[1]] == [row_ids(p) for p in args[0]]
    only_future, kw = dispatch_dp_compute_data_proto(wg, fut)
    assert "_sc_padding_size" not in kw
    assert [len(p.get()) for p in only_future[0]] == [2, 2, 1, 1]


def test_future_collect_concat_and_lazy_unpad() -> None:
    wg = FakeWorkerGroup(4)
    dp = make_dp(8)
    per_rank = [DataProtoFuture.from_value(p) for p in dp.chunk(4)]
    combined = collect_dp_compute_data_proto(wg, per_rank)
    assert isinstance(combined, DataProtoFuture)
    assert combined.num_rows == 8
    trimmed = unpad_output(combined, 3)
    assert isinstance(trimmed, DataProtoFuture)
    assert trimmed.num_rows == 5
    assert trimmed.shard_refs == combined.shard_refs[:3]
    assert row_ids(trimmed.get()) == [0, 1, 2, 3, 4]
    unknown = [DataProtoFuture.from_shards([p]) for p in dp.chunk(4)]
    lazy = unpad_output(collect_dp_compute_data_proto(wg, unknown), 3)
    assert lazy.num_rows is None
    assert row_ids(lazy.get()) == [0, 1, 2, 3, 4]


def test_with_func_and_nd_dispatch() -> None:
    wg = FakeWorkerGroup(2)
    args, _ = dispatch_dp_compute_data_proto_with_func(wg, len, make_dp(4))
    assert args[0] == [len, len]
    assert [len(p) for p in args[1]] == [2, 2]
    mesh_wg = FakeWorkerGroup(4, {"actor": MeshLayout.from_sizes(dp_size=2, tp_size=2)})
    mode = make_nd_compute_dataproto_dispatch_fn("actor")
    out = run_call(mesh_wg, mode, double_ids, make_dp(6))
    assert out.batch["ids"][:, 0].tolist() == [i * 6 for i in range(6)]
    td = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    assert run_call(mesh_wg, mode, lambda t: t, td)["x"].tolist() == [0, 1, 2, 3]


def test_the_dataproto_metadata_form_keeps_rows_and_meta_info_only() -> None:
    dp = make_dp(6, meta={"temperature": 0.5})
    meta = DataProtoAdapter().metadata_only(dp)
    assert type(meta) is DataProto
    assert len(meta) == 6
    assert meta.meta_info == {"temperature": 0.5}
    assert meta.meta_info is not dp.meta_info
    assert meta.batch is not None
    assert list(meta.batch.keys()) == []
    assert meta.batch.batch_size == torch.Size([6])
    assert meta.non_tensor_batch == {}
    assert payload_nbytes(meta) == 0
    no_batch = DataProtoAdapter().metadata_only(make_dp(3, tensors=False))
    assert len(no_batch) == 3


def test_nd_dispatch_sends_middle_stages_metadata_only_dataprotos() -> None:
    # pp 3 x dp 2 (pp slowest): stages 0 and 2 read the batch, stage 1 gets metadata only
    layout = MeshLayout(
        (0, 1) * 3,
        (False,) * 4 + (True, True),
        receives_data=(True, True, False, False, True, True),
    )
    wg = FakeWorkerGroup(6, {"actor": layout})
    mode = make_nd_compute_dataproto_dispatch_fn("actor")
    spec = resolve_dispatch_mode(mode)
    dp = make_dp(4, meta={"step": 3})
    plan = spec.plan(wg, Execute.ALL, (dp,), {})
    got = {}
    for unit in plan.units:
        assert unit.slot is not None
        slot = plan.slots[unit.slot]
        for rank, (args, _) in zip(slot.ranks, plan.rank_arguments(unit, unit.slot), strict=True):
            got[rank] = args[0]
    assert [row_ids(got[r]) for r in (0, 4)] == [[0, 1], [0, 1]]
    assert [row_ids(got[r]) for r in (1, 5)] == [[2, 3], [2, 3]]
    assert got[2] is got[3]
    assert len(got[2]) == 2
    assert got[2].meta_info == {"step": 3}
    assert got[2].batch is not None
    assert list(got[2].batch.keys()) == []
    sizes = plan.rank_nbytes()
    assert sizes[2] == sizes[3] == 0
    assert sizes[0] == sizes[4] == payload_nbytes(dp) // 2
    # a TensorDict has no metadata form: every rank gets its shard
    td = TensorDict({"x": torch.arange(4)}, batch_size=[4])
    td_plan = spec.plan(wg, Execute.ALL, (td,), {})
    firsts = td_plan.rank_arguments(td_plan.units[0], 0)
    assert all(a[0] is td_plan.units[0].args[0] for a, _ in firsts)
    out = run_call(wg, mode, double_ids, dp)
    assert out.batch["ids"][:, 0].tolist() == [i * 6 for i in range(4)]
