"""``sc_dispatch.verl`` as a drop-in for verl's decorator module: code that imports that
module under an alias and reaches everything through it (register a dispatch mode, read the
registry, decorate worker methods, look the functions up) runs with only the import line
changed."""

from __future__ import annotations

from typing import Any

import pytest
import sc_dispatch
import sc_dispatch.verl as decorator  # was: import verl.single_controller.base.decorator as ...
from _dispatch_fakes import unique_name
from sc_dispatch import DispatchModeExistsError
from sc_dispatch.testing import FakeWorkerGroup


def _dispatch_doubled(worker_group: Any, *args: Any, **kwargs: Any) -> Any:
    args = tuple([2 * a] * worker_group.world_size for a in args)
    return args, {k: [v] * worker_group.world_size for k, v in kwargs.items()}


def _collect_total(worker_group: Any, output: Any) -> Any:
    return sum(output)


def _collect_first(worker_group: Any, output: Any) -> Any:
    return output[0]


def test_the_alias_registers_a_mode_and_reads_it_back() -> None:
    name = unique_name("VERL_ALIAS")
    decorator.register_dispatch_mode(name, _dispatch_doubled, _collect_total)
    mode = getattr(decorator.Dispatch, name)
    entry = decorator.DISPATCH_MODE_FN_REGISTRY[mode]
    assert entry == {"dispatch_fn": _dispatch_doubled, "collect_fn": _collect_total}
    assert decorator.get_predefined_dispatch_fn(mode) == entry

    group = FakeWorkerGroup(3)
    args, kwargs = entry["dispatch_fn"](group, 5)
    assert args == ([10, 10, 10],)
    assert kwargs == {}
    assert entry["collect_fn"](group, [1, 2, 3]) == 6

    decorator.update_dispatch_mode(mode, _dispatch_doubled, _collect_first)
    assert decorator.DISPATCH_MODE_FN_REGISTRY[mode]["collect_fn"] is _collect_first
    with pytest.raises(DispatchModeExistsError, match=name):
        decorator.register_dispatch_mode(name, _dispatch_doubled, _collect_total)


def test_the_alias_decorates_worker_methods_as_verl_reads_them() -> None:
    mesh_mode = decorator.make_nd_compute_dataproto_dispatch_fn(mesh_name="train")

    class Worker:
        @decorator.register(dispatch_mode=decorator.Dispatch.DP_COMPUTE_PROTO)
        def compute(self, data: Any) -> Any:
            return data

        @decorator.register(dispatch_mode=mesh_mode, blocking=False)
        def on_mesh(self, data: Any) -> Any:
            return data

        @decorator.register(execute_mode=decorator.Execute.RANK_ZERO)
        def once(self) -> int:
            return 1

    attrs = getattr(Worker.compute, decorator.MAGIC_ATTR)
    assert attrs["dispatch_mode"] is decorator.Dispatch.DP_COMPUTE_PROTO
    assert attrs["execute_mode"] is decorator.Execute.ALL
    assert attrs["blocking"] is True
    assert getattr(Worker.on_mesh, decorator.MAGIC_ATTR)["dispatch_mode"] is mesh_mode
    assert getattr(Worker.once, decorator.MAGIC_ATTR)["execute_mode"] is decorator.Execute.RANK_ZERO
    assert decorator.get_predefined_execute_fn(decorator.Execute.RANK_ZERO) == {
        "execute_fn_name": "execute_rank_zero"
    }
    assert Worker().compute(4) == 4


def test_a_user_writes_one_module_for_every_name_verl_code_reaches() -> None:
    # what verl's decorator module offers and sc has; a worker class written against either
    # sc_dispatch or the alias gets the same objects
    for name in (
        "register",
        "Dispatch",
        "Execute",
        "register_dispatch_mode",
        "update_dispatch_mode",
        "make_nd_compute_dataproto_dispatch_fn",
    ):
        assert getattr(decorator, name) is getattr(sc_dispatch, name), name
    for name in (
        "MAGIC_ATTR",
        "DISPATCH_MODE_FN_REGISTRY",
        "DynamicEnum",
        "get_predefined_dispatch_fn",
        "get_predefined_execute_fn",
        "dispatch_one_to_all",
        "dispatch_all_to_all",
        "collect_all_to_all",
        "dispatch_dp_compute",
        "collect_dp_compute",
        "dispatch_dp_compute_data_proto",
        "dispatch_dp_compute_data_proto_with_func",
        "collect_dp_compute_data_proto",
    ):
        assert name in decorator.__all__, name
