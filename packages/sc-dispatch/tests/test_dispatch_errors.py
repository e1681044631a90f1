"""The exception tree and every error the brief lists, with the content of each message."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import sc_dispatch as scd
import sc_dispatch._errors as errors_module
import sc_dispatch._setting as setting_module
from _dispatch_fakes import Batch, FakeWorkerGroup, unique_name
from sc_dispatch import (
    Dispatch,
    DispatchArgumentError,
    DispatchModeExistsError,
    InvalidDispatchModeError,
    MeshLayoutError,
    NotShardableError,
    ScDispatchError,
    UnknownDispatchModeError,
    ext,
    verl,
)


def _noop_dispatch(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    return args, kwargs


def _noop_collect(worker_group: Any, output: Any) -> Any:
    return output


#: The builtin exceptions a class may mean; each sc-dispatch error means exactly one.
MEANINGS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    LookupError,
    NotImplementedError,
    RuntimeError,
    TimeoutError,
    AttributeError,
)


def _meanings(exc: type[BaseException]) -> list[type[BaseException]]:
    """The builtin exception classes ``exc`` derives from, most specific first, without the
    ones implied by another (``KeyError`` implies ``LookupError``)."""
    found = [m for m in MEANINGS if issubclass(exc, m)]
    return [m for m in found if not any(o is not m and issubclass(o, m) for o in found)]


ALL_ERRORS = [
    (scd.UnknownDispatchModeError, KeyError),
    (scd.DispatchModeTypeError, TypeError),
    (DispatchModeExistsError, ValueError),
    (InvalidDispatchModeError, ValueError),
    (DispatchArgumentError, ValueError),
    (NotShardableError, TypeError),
    (MeshLayoutError, ValueError),
    (scd.DirectRolloutCallError, NotImplementedError),
    (errors_module.SettingValueError, ValueError),
    (errors_module.SettingDeclarationError, ValueError),
]


@pytest.mark.parametrize(("exc", "meaning"), ALL_ERRORS)
def test_each_error_subclasses_exactly_the_builtin_it_means(
    exc: type[Exception], meaning: type[Exception]
) -> None:
    assert issubclass(exc, ScDispatchError)
    assert _meanings(exc) == [meaning]


def test_the_base_class_means_no_builtin() -> None:
    assert _meanings(ScDispatchError) == []
    assert ScDispatchError.__bases__ == (Exception,)


def test_every_error_is_in_the_table() -> None:
    # the public errors, and the two of the settings framework (private, shared by sc)
    exported = [(module, name) for module in (scd, setting_module) for name in module.__all__]
    errors = {
        getattr(module, name)
        for module, name in exported
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), BaseException)
    }
    assert errors == {ScDispatchError, *(e for e, _ in ALL_ERRORS)}


def test_one_base_name() -> None:
    assert not hasattr(scd, "DispatchError")  # sc 0.1's alias is gone


def test_exception_tree_is_documented_in_one_docstring() -> None:
    doc = errors_module.__doc__ or ""
    for exc in (
        ScDispatchError,
        UnknownDispatchModeError,
        DispatchModeExistsError,
        InvalidDispatchModeError,
        DispatchArgumentError,
        NotShardableError,
        MeshLayoutError,
        scd.DispatchModeTypeError,
        scd.DirectRolloutCallError,
        errors_module.SettingValueError,
        errors_module.SettingDeclarationError,
    ):
        assert exc.__name__ in doc


def test_an_unknown_name_looked_up_is_a_key_error_naming_the_known_modes() -> None:
    # verl's lookup is a dict lookup: code catches KeyError.
    bare = Dispatch.register(unique_name("BARE"))  # a member without functions
    for unknown in ("NOT_A_MODE", 3, None, bare):
        with pytest.raises(KeyError, match=r"known: \[.*'DP_COMPUTE_PROTO'.*\]") as info:
            verl.get_predefined_dispatch_fn(unknown)  # type: ignore[arg-type]
        assert isinstance(info.value, UnknownDispatchModeError)
        assert repr(unknown) in str(info.value)
        assert unknown not in verl.DISPATCH_MODE_FN_REGISTRY
        with pytest.raises(UnknownDispatchModeError):
            verl.DISPATCH_MODE_FN_REGISTRY[unknown]  # type: ignore[index]
        assert verl.DISPATCH_MODE_FN_REGISTRY.get(unknown) is None  # type: ignore[arg-type]
    Dispatch.remove(bare.name)


def test_a_string_as_register_mode_is_a_type_error_naming_the_value() -> None:
    # Where a mode is configured (not looked up), a string is the wrong type.
    with pytest.raises(TypeError, match=r"str 'DP_COMPUTE'") as info:
        ext.resolve_dispatch_mode("DP_COMPUTE")  # type: ignore[arg-type]
    assert isinstance(info.value, scd.DispatchModeTypeError)


def test_the_verl_registry_view_is_live_and_read_only() -> None:
    registry = verl.DISPATCH_MODE_FN_REGISTRY
    assert registry[Dispatch.ONE_TO_ALL] == verl.get_predefined_dispatch_fn(Dispatch.ONE_TO_ALL)
    assert set(registry) >= {Dispatch.ONE_TO_ALL, Dispatch.DP_COMPUTE_PROTO, Dispatch.RANK_ZERO}
    before = len(registry)
    name = unique_name("VIEW")
    scd.register_dispatch_mode(name, _noop_dispatch, _noop_collect)
    try:
        assert len(registry) == before + 1
        assert registry[Dispatch[name]] == {
            "dispatch_fn": _noop_dispatch,
            "collect_fn": _noop_collect,
        }
        assert name in repr(registry)
    finally:
        Dispatch.remove(name)
    with pytest.raises(TypeError):
        registry[Dispatch.ONE_TO_ALL] = {}  # type: ignore[index]
    snapshot = verl.DISPATCH_MODE_FN_REGISTRY.copy()  # verl's fixtures copy it
    assert type(snapshot) is dict
    assert snapshot == dict(registry.items())
    snapshot.clear()
    assert len(registry) == before
    gone = unique_name("GONE")
    scd.register_dispatch_mode(gone, _noop_dispatch, _noop_collect)
    removed = Dispatch.from_name(gone)
    assert removed is not None
    assert removed in registry
    Dispatch.remove(removed.name)
    assert removed not in registry
    assert removed not in list(registry)


def test_member_without_functions_is_unknown_and_named() -> None:
    name = unique_name("BARE")
    member = Dispatch.register(name)
    try:
        with pytest.raises(KeyError, match=rf"dispatch mode {name} has no") as info:
            ext.resolve_dispatch_mode(member)
        assert isinstance(info.value, UnknownDispatchModeError)
    finally:
        Dispatch.remove(name)


def test_unknown_member_by_name() -> None:
    assert Dispatch.from_name("NOPE") is None
    with pytest.raises(KeyError, match=r"Dispatch has no member 'NOPE'"):
        Dispatch["NOPE"]
    for unknown in ("NOPE", "register", 7, None):
        with pytest.raises(KeyError, match=r"Dispatch.remove: no member .*known: \[") as info:
            Dispatch.remove(unknown)  # type: ignore[arg-type]
        assert isinstance(info.value, UnknownDispatchModeError)
    assert Dispatch.DP_COMPUTE in Dispatch  # nothing was removed


def test_an_unknown_execute_mode_is_a_key_error() -> None:
    for unknown in ("ALL", 0, None):
        expected = r"no execute mode .*known: \['ALL', 'RANK_ZERO'\]"
        with pytest.raises(KeyError, match=expected) as info:
            verl.get_predefined_execute_fn(unknown)  # type: ignore[arg-type]
        assert isinstance(info.value, UnknownDispatchModeError)


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
    with pytest.raises(TypeError, match=r"'GHOST'"):
        scd.update_dispatch_mode("GHOST", _noop_dispatch, _noop_collect)  # type: ignore[arg-type]
    name = unique_name("UNFILLED")
    member = Dispatch.register(name)
    try:
        with pytest.raises(KeyError, match=rf"dispatch mode {name}"):
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
        ext.resolve_dispatch_mode(mapping)
    with pytest.raises(InvalidDispatchModeError, match=missing):
        scd.register(dispatch_mode=mapping)


def test_custom_mode_mapping_with_non_callable_function() -> None:
    with pytest.raises(TypeError, match=r"collect_fn must be callable, got 42"):
        ext.resolve_dispatch_mode({"dispatch_fn": _noop_dispatch, "collect_fn": 42})
    with pytest.raises(TypeError, match=r"dispatch_fn must be callable, got 'x'"):
        scd.register_dispatch_mode(unique_name(), "x", _noop_collect)  # type: ignore[arg-type]


def test_custom_mode_mapping_with_unknown_key() -> None:
    with pytest.raises(InvalidDispatchModeError, match=r"unknown keys \['colect_fn'\]"):
        ext.resolve_dispatch_mode(
            {"dispatch_fn": _noop_dispatch, "collect_fn": _noop_collect, "colect_fn": 1}
        )


def test_dp_compute_length_not_world_size() -> None:
    wg = FakeWorkerGroup(4)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE: positional argument 0 has 3 "
        r"entries, expected the world size 4",
    ):
        verl.dispatch_dp_compute(wg, [1, 2, 3])
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE: keyword argument 'x' has 5"):
        verl.dispatch_dp_compute(wg, x=(1, 2, 3, 4, 5))


def test_dp_compute_non_sequence_names_type_and_value() -> None:
    with pytest.raises(NotShardableError, match=r"DP_COMPUTE: positional argument 0 .* got int 7"):
        verl.dispatch_dp_compute(FakeWorkerGroup(2), 7)


def test_shardable_arguments_of_different_lengths() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE_PROTO: .*same length, got positional argument 0: 4, "
        r"keyword argument 'b': 3",
    ):
        verl.dispatch_dp_compute_data_proto(wg, Batch([1, 2, 3, 4]), b=Batch([1, 2, 3]))


def test_non_shardable_argument_to_a_splitting_mode() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        NotShardableError,
        match=r"DP_COMPUTE_PROTO: keyword argument 'cfg' of "
        r"type dict cannot be split across 2 workers \(\{'lr': 0.1\}\)",
    ):
        verl.dispatch_dp_compute_data_proto(wg, Batch([1, 2]), cfg={"lr": 0.1})
    with pytest.raises(TypeError):  # NotShardableError is a TypeError
        verl.dispatch_dp_compute_data_proto(wg, "ab")


@pytest.mark.parametrize("value", [[1, 2, 3, 4], (1, 2, 3, 4), {"a": 1, "b": 2}])
@pytest.mark.parametrize(
    "mode",
    [Dispatch.DP_COMPUTE_PROTO, Dispatch.DP_COMPUTE_PROTO_WITH_FUNC, Dispatch.DP_COMPUTE_METRIC],
)
def test_plain_containers_are_not_batches_for_splitting_modes(value: Any, mode: Any) -> None:
    """Lists and tuples are per-rank arguments (DP_COMPUTE); a splitting mode refuses them
    with a TypeError before anything is sent, as verl does."""
    spec = ext.resolve_dispatch_mode(mode)
    args = (len, value) if mode is Dispatch.DP_COMPUTE_PROTO_WITH_FUNC else (value,)
    with pytest.raises(NotShardableError, match=r"(DP_COMPUTE|not plain sequences|dict)") as info:
        spec.dispatch_fn(FakeWorkerGroup(2), *args)
    assert isinstance(info.value, TypeError)
    if not isinstance(value, dict):
        assert "use Dispatch.DP_COMPUTE" in str(info.value)


def test_rows_is_the_stdlib_batch() -> None:
    args, _ = verl.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), scd.Rows([1, 2, 3, 4]))
    assert args == [[scd.Rows([1, 2]), scd.Rows([3, 4])]]
    assert all(type(part) is scd.Rows for part in args[0])
    joined = verl.collect_dp_compute_data_proto(FakeWorkerGroup(2), args[0])
    assert type(joined) is scd.Rows
    assert joined == [1, 2, 3, 4]


def test_long_values_are_abbreviated_in_messages() -> None:
    with pytest.raises(NotShardableError) as info:
        verl.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), "x" * 500)
    with pytest.raises(NotShardableError) as info:
        verl.dispatch_dp_compute_data_proto(FakeWorkerGroup(2), list(range(500)))
    assert "..." in str(info.value)
    assert "..." in str(info.value)
    assert len(str(info.value)) < 400


def test_mesh_dp_ranks_not_zero_to_dp_size() -> None:
    wg = FakeWorkerGroup(4, {"actor": ([0, 0, 2, 2], [True, False, True, False])})
    fns = scd.make_nd_compute_dataproto_dispatch_fn("actor")
    with pytest.raises(MeshLayoutError, match=r"mesh 'actor'.*0\.\.2, got \[0, 0, 2, 2\]"):
        fns["dispatch_fn"](wg, Batch([1, 2]))
    wg_neg = FakeWorkerGroup(2, {"m": ([-1, 0], [True, True])})
    with pytest.raises(MeshLayoutError, match=r"got \[-1, 0\]"):
        ext.mesh_layout(wg_neg, "m")


def test_mesh_with_wrong_number_of_entries() -> None:
    wg = FakeWorkerGroup(3, {"m": ([0, 1], [True, True])})
    with pytest.raises(MeshLayoutError, match=r"mesh 'm'.*world size 3.*got 2 dp ranks"):
        ext.mesh_layout(wg, "m")


def test_with_func_non_callable_first_argument() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        NotShardableError,
        match=r"DP_COMPUTE_PROTO_WITH_FUNC: the first positional "
        r"argument must be callable, got list \[1, 2\]",
    ):
        verl.dispatch_dp_compute_data_proto_with_func(wg, [1, 2], Batch([3, 4]))
    with pytest.raises(NotShardableError, match=r"got no positional argument"):
        verl.dispatch_dp_compute_data_proto_with_func(wg, data=Batch([3, 4]))


@pytest.mark.parametrize(("rows", "shards"), [(3, 4), (5, 2), (7, 4), (2, 4)])
def test_uneven_batch_without_padding_names_length_and_shards(rows: int, shards: int) -> None:
    wg = FakeWorkerGroup(shards)
    batch = Batch(list(range(rows)), auto_pad=False)
    with pytest.raises(
        DispatchArgumentError,
        match=rf"DP_COMPUTE_PROTO: a batch of {rows} rows does not divide evenly into "
        rf"{shards} shards",
    ) as info:
        verl.dispatch_dp_compute_data_proto(wg, batch)
    assert isinstance(info.value, ValueError)
    assert "auto-padding" in str(info.value)
    # With padding on, the same batch is padded to the next multiple, as before.
    _, kwargs = verl.dispatch_dp_compute_data_proto(wg, Batch(list(range(rows))))
    assert kwargs[ext.PADDING_SIZE_KEY] == shards - rows % shards


def test_uneven_batch_on_a_mesh_without_padding() -> None:
    wg = FakeWorkerGroup(4, {"m": ([0, 0, 1, 1], [True, False, True, False])})
    fns = scd.make_nd_compute_dataproto_dispatch_fn("m")
    with pytest.raises(
        DispatchArgumentError, match=r"mesh 'm': a batch of 3 rows does not divide evenly into 2"
    ):
        fns["dispatch_fn"](wg, Batch([1, 2, 3], auto_pad=False))


def test_empty_batch_is_rejected_even_though_it_divides_evenly() -> None:
    wg = FakeWorkerGroup(2)
    with pytest.raises(
        DispatchArgumentError,
        match=r"DP_COMPUTE_PROTO: .*empty batch \(0 rows\) "
        r"into 2 shards",
    ):
        verl.dispatch_dp_compute_data_proto(wg, Batch([], auto_pad=False))
    with pytest.raises(DispatchArgumentError, match=r"empty batch"):
        verl.dispatch_dp_compute_data_proto(wg, Batch([]))


def test_worker_group_without_world_size() -> None:
    with pytest.raises(
        DispatchArgumentError,
        match=r"ONE_TO_ALL: worker group .* world_size "
        r"\(got None\)",
    ):
        verl.dispatch_one_to_all(object(), 1)  # type: ignore[arg-type]
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE_PROTO: .*\(got 0\)"):
        scd.verl.dispatch_dp_compute_data_proto(SimpleNamespace(world_size=0), Batch([1]))


def test_direct_rollout_method_from_the_driver() -> None:
    fns = verl.get_predefined_dispatch_fn(Dispatch.DIRECT_ROLLOUT_METHOD)
    with pytest.raises(NotImplementedError, match=r"DIRECT_ROLLOUT_METHOD") as info:
        fns["dispatch_fn"](FakeWorkerGroup(1))
    assert isinstance(info.value, scd.DirectRolloutCallError)
    with pytest.raises(NotImplementedError, match=r"DIRECT_ROLLOUT_METHOD"):
        fns["collect_fn"](FakeWorkerGroup(1), [None])


def test_collect_errors_name_the_mode() -> None:
    wg = FakeWorkerGroup(3)
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE: expected 3 outputs .* got 2"):
        verl.collect_dp_compute(wg, [1, 2])
    with pytest.raises(DispatchArgumentError, match=r"DP_COMPUTE_PROTO: no outputs"):
        verl.collect_dp_compute_data_proto(wg, [])
    with pytest.raises(NotShardableError, match=r"one type to be joined, got \['list', 'tuple'\]"):
        verl.collect_dp_compute_data_proto(wg, [[1], (2,), [3]])
    with pytest.raises(NotShardableError, match=r"outputs of type int cannot be joined"):
        verl.collect_dp_compute_data_proto(wg, [1, 2, 3])


def test_register_shardable_and_future_type_need_classes() -> None:
    with pytest.raises(NotShardableError, match=r"register_shardable: expected a class, got 3"):
        ext.register_shardable(3, object())  # type: ignore[arg-type]
    with pytest.raises(NotShardableError, match=r"register_future_type: expected a class"):
        ext.register_future_type("Future")  # type: ignore[arg-type]


def test_nd_mesh_name_must_be_a_non_empty_string() -> None:
    with pytest.raises(DispatchArgumentError, match=r"mesh_name .* got ''"):
        scd.make_nd_compute_dataproto_dispatch_fn("")
