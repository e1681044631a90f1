"""The exception tree and every error the brief lists, with the content of each message."""

from __future__ import annotations

from typing import Any

import pytest
import sc_dispatch as scd
import sc_dispatch._errors as errors_module
from _dispatch_fakes import Batch, FakeWorkerGroup, unique_name
from sc_dispatch import (
    Dispatch,
    DispatchArgumentError,
    DispatchError,
    DispatchModeExistsError,
    InvalidDispatchModeError,
    MeshLayoutError,
    NotShardableError,
    UnknownDispatchModeError,
)


def _noop_dispatch(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    return args, kwargs


def _noop_collect(worker_group: Any, output: Any) -> Any:
    return output


@pytest.mark.parametrize(
    ("exc", "bases"),
    [
        (DispatchError, (ValueError,)),
        (UnknownDispatchModeError, (DispatchError, ValueError)),
        (DispatchModeExistsError, (DispatchError, ValueError)),
        (InvalidDispatchModeError, (DispatchError, ValueError)),
        (DispatchArgumentError, (DispatchError, ValueError)),
        (NotShardableError, (DispatchArgumentError, DispatchError, ValueError, TypeError)),
        (MeshLayoutError, (DispatchError, ValueError)),
    ],
)
def test_each_error_subclasses_the_builtin_it_means(
    exc: type[Exception], bases: tuple[type[Exception], ...]
) -> None:
    for base in bases:
        assert issubclass(exc, base)


def test_only_not_shardable_is_a_type_error() -> None:
    typed = [
        e
        for e in (
            UnknownDispatchModeError,
            DispatchModeExistsError,
            InvalidDispatchModeError,
            DispatchArgumentError,
            MeshLayoutError,
        )
        if issubclass(e, TypeError)
    ]
    assert typed == []


def test_exception_tree_is_documented_in_one_docstring() -> None:
    doc = errors_module.__doc__ or ""
    for exc in (
        DispatchError,
        UnknownDispatchModeError,
        DispatchModeExistsError,
        InvalidDispatchModeError,
        DispatchArgumentError,
        NotShardableError,
        MeshLayoutError,
    ):
        assert exc.__name__ in doc


def test_unknown_mode_names_the_value() -> None:
    with pytest.raises(UnknownDispatchModeError, match=r"str 'NOT_A_MODE'"):
        scd.get_predefined_dispatch_fn("NOT_A_MODE")  # type: ignore[arg-type]


def test_member_without_functions_is_unknown_and_named() -> None:
    name = unique_name("BARE")
    member = Dispatch.register(name)
    try:
        with pytest.raises(UnknownDispatchModeError, match=rf"dispatch mode {name} has no"):
            scd.resolve_dispatch_mode(member)
    finally:
        Dispatch.remove(name)


def test_unknown_member_by_name() -> None:
    with pytest.raises(UnknownDispatchModeError, match=r"Dispatch has no member 'NOPE'"):
        Dispatch.from_name("NOPE")
    with pytest.raises(UnknownDispatchModeError, match=r"'NOPE'"):
        Dispatch["NOPE"]


def test_unknown_execute_mode_names_the_value() -> None:
    with pytest.raises(UnknownDispatchModeError, match=r"'ALL'"):
        scd.get_predefined_execute_fn("ALL")  # type: ignore[arg-type]


def test_registering_a_name_twice() -> None:
    with pytest.raises(DispatchModeExistsError, match=r"register_dispatch_mode: .*'DP_COMPUTE'"):
        scd.register_dispatch_mode("DP_COMPUTE", _noop_dispatch, _noop_collect)
    name = unique_name()
    scd.register_dispatch_mode(name, _noop_dispatch, _noop_collect)
    try:
        with pytest.raises(DispatchModeExistsError, match=rf"'{name}' already exists"):
            scd.register_dispatch_mode(name, _noop_dispatch, _noop_collect)
    finally:
        Dispatch.remove(name)


def test_updating_a_mode_that_does_not_exist() -> None:
    with pytest.raises(UnknownDispatchModeError, match=r"'GHOST'"):
        scd.update_dispatch_mode("GHOST", _noop_dispatch, _noop_collect)  # type: ignore[arg-type]
    name = unique_name("UNFILLED")
    member = Dispatch.register(name)
    try:
        with pytest.raises(UnknownDispatchModeError, match=rf"dispatch mode {name}"):
            scd.update_dispatch_mode(member, _noop_dispatch, _noop_collect)
    finally:
        Dispatch.remove(name)


@pytest.mark.parametrize(
    ("mapping", "missing"),
    [
        ({"dispatch_fn": _noop_dispatch}, "collect_fn"),
        ({"collect_fn": _noop_collect}, "dispatch_fn"),
        ({}, "dispatch_fn"),
    ],
)
def test_custom_mode_mapping_without_both_functions(mapping: dict[str, Any], missing: str) -> None:
    with pytest.raises(InvalidDispatchModeError, match=rf"lacks \[.*'{missing}'"):
        scd.resolve_dispatch_mode(mapping)
    with pytest.raises(InvalidDispatchModeError, match=missing):
        scd.register(dispatch_mode=mapping)


def test_custom_mode_mapping_with_non_callable_function() -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"collect_fn must be callable, got 42"):
        scd.resolve_dispatch_mode({"dispatch_fn": _noop_dispatch, "collect_fn": 42})
    with pytest.raises(InvalidDispatchModeError, match=r"dispatch_fn must be callable, got 'x'"):
        scd.register_dispatch_mode(unique_name(), "x", _noop_collect)  # type: ignore[arg-type]


def test_custom_mode_mapping_with_unknown_key() -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"unknown keys \['colect_fn'\]"):
        scd.resolve_dispatch_mode(
            {"dispatch_fn": _noop_dispatch, "collect_fn": _noop_collect, "colect_fn": 1}
        )


def test_dp_compute_length_not_world_size() -> None:
    wg = FakeWorkerGroup(4)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE: positional argument 0 has 3 "
        r"entries, expected the world size 4",
    ):
        scd.dispatch_dp_compute(wg, [1, 2, 3])
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE: keyword argument 'x' has 5"):
        scd.dispatch_dp_compute(wg, x=(1, 2, 3, 4, 5))


def test_dp_compute_non_sequence_names_type_and_value() -> None:
    with pytest.raises(NotShardableError, match=r"DP_COMPUTE: positional argument 0 .* got int 7"):
        scd.dispatch_dp_compute(FakeWorkerGroup(2), 7)


def test_shardable_arguments_of_different_lengths() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE_PROTO: .*same length, got positional argument 0: 4, "
        r"keyword argument 'b': 3",
    ):
        scd.dispatch_dp_compute_data_proto(wg, [1, 2, 3, 4], b=Batch([1, 2, 3]))


def test_non_shardable_argument_to_a_splitting_mode() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        NotShardableError,
        match=r"DP_COMPUTE_PROTO: keyword argument 'cfg' of "
        r"type dict cannot be split across 2 workers \(\{'lr': 0.1\}\)",
    ):
        scd.dispatch_dp_compute_data_proto(wg, [1, 2], cfg={"lr": 0.1})
    with pytest.raises(TypeError):  # NotShardableError is also a TypeError
        scd.dispatch_dp_compute_data_proto(wg, "ab")


def test_long_values_are_abbreviated_in_messages() -> None:
    with pytest.raises(NotShardableError) as info:
        scd.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), "x" * 500)
    assert "..." in str(info.value)
    assert len(str(info.value)) < 400


def test_mesh_dp_ranks_not_zero_to_dp_size() -> None:
    wg = FakeWorkerGroup(4, {"actor": ([0, 0, 2, 2], [True, False, True, False])})
    fns = scd.make_nd_compute_dataproto_dispatch_fn("actor")
    with pytest.raises(MeshLayoutError, match=r"mesh 'actor'.*0\.\.2, got \[0, 0, 2, 2\]"):
        fns["dispatch_fn"](wg, [1, 2])
    wg_neg = FakeWorkerGroup(2, {"m": ([-1, 0], [True, True])})
    with pytest.raises(MeshLayoutError, match=r"got \[-1, 0\]"):
        scd.mesh_layout(wg_neg, "m")


def test_mesh_with_wrong_number_of_entries() -> None:
    wg = FakeWorkerGroup(3, {"m": ([0, 1], [True, True])})
    with pytest.raises(MeshLayoutError, match=r"mesh 'm'.*world size 3.*got 2 dp ranks"):
        scd.mesh_layout(wg, "m")


def test_with_func_non_callable_first_argument() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        NotShardableError,
        match=r"DP_COMPUTE_PROTO_WITH_FUNC: the first positional "
        r"argument must be callable, got list \[1, 2\]",
    ):
        scd.dispatch_dp_compute_data_proto_with_func(wg, [1, 2], [3, 4])
    with pytest.raises(NotShardableError, match=r"got no positional argument"):
        scd.dispatch_dp_compute_data_proto_with_func(wg, data=[3, 4])


def test_batch_shorter_than_shards_without_padding() -> None:
    wg = FakeWorkerGroup(4)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE_PROTO: batch of 3 rows is "
        r"shorter than the 4 shards",
    ):
        scd.dispatch_dp_compute_data_proto(wg, [1, 2, 3])
    with pytest.raises(DispatchArgumentError, match=r"batch of 2 rows"):
        scd.dispatch_dp_compute_data_proto(wg, Batch([1, 2], auto_pad=False))


def test_empty_batch_is_rejected_even_though_it_divides_evenly() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE_PROTO: .*empty batch \(0 rows\) "
        r"into 2 shards",
    ):
        scd.dispatch_dp_compute_data_proto(wg, [])
    with pytest.raises(DispatchArgumentError, match=r"empty batch"):
        scd.dispatch_dp_compute_data_proto(wg, Batch([]))


def test_worker_group_without_world_size() -> None:
    with pytest.raises(
        DispatchArgumentError,
        match=r"ONE_TO_ALL: worker group .* world_size "
        r"\(got None\)",
    ):
        scd.dispatch_one_to_all(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE_PROTO: .*\(got 0\)"):
        scd.dispatch_dp_compute_data_proto(FakeWorkerGroup(0), [1])


def test_direct_rollout_method_from_the_driver() -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"DIRECT_ROLLOUT_METHOD"):
        scd.get_predefined_dispatch_fn(Dispatch.DIRECT_ROLLOUT_METHOD)["dispatch_fn"](
            FakeWorkerGroup(1)
        )


def test_collect_errors_name_the_mode() -> None:
    wg = FakeWorkerGroup(3)
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE: expected 3 outputs .* got 2"):
        scd.collect_dp_compute(wg, [1, 2])
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE_PROTO: no outputs"):
        scd.collect_dp_compute_data_proto(wg, [])
    with pytest.raises(NotShardableError, match=r"one type to be joined, got \['list', 'tuple'\]"):
        scd.collect_dp_compute_data_proto(wg, [[1], (2,), [3]])
    with pytest.raises(NotShardableError, match=r"outputs of type int cannot be joined"):
        scd.collect_dp_compute_data_proto(wg, [1, 2, 3])


def test_register_shardable_and_future_type_need_classes() -> None:
    with pytest.raises(NotShardableError, match=r"register_shardable: expected a class, got 3"):
        scd.register_shardable(3, object())  # type: ignore[arg-type]
    with pytest.raises(NotShardableError, match=r"register_future_type: expected a class"):
        scd.register_future_type("Future")  # type: ignore[arg-type]


def test_nd_mesh_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(DispatchArgumentError, match=r"mesh_name .* got ''"):
        scd.make_nd_compute_dataproto_dispatch_fn("")
