"""Correct calls in the plain spelling, ``wg.method_name(...)``: mypy with
``sc_core.mypy_plugin`` must accept this file, and every ``assert_type`` must hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from _typing_workers import Actor, DataProto, PatientActor, identity
from sc_core import LocalWorkerGroup, MethodProxy, WorkerGroup

if TYPE_CHECKING:
    from typing_extensions import assert_type


def calls(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    assert_type(wg.init_model("/ckpt"), list[int])
    assert_type(wg.init_model(path="/ckpt", strict=False), list[int])
    assert_type(wg.update_actor(batch), DataProto)
    assert_type(wg.apply(identity, batch), DataProto)
    assert_type(wg.metrics(batch), list[dict[str, float]])
    assert_type(wg.save("/out"), str)
    assert_type(wg.per_rank([1, 2]), list[float])
    assert_type(wg.default_mode([1, 2]), list[int])
    assert_type(wg.ping("x"), list[str])
    assert_type(wg.generate(batch), Any)
    assert_type(wg.compute_log_prob(batch), DataProto)
    assert_type(wg.custom(3), list[str])
    assert_type(wg.explicit_execute(3), Any)
    # A mapping mode in the decorator: its collect_fn's return annotation, arguments unchecked.
    assert_type(wg.counted(3), int)
    assert_type(wg.counted("any", "thing"), int)
    assert_type(wg.update_actor.options(timeout=30)(batch), DataProto)
    assert_type(wg.update_actor.options(blocking=False)(batch), Any)
    proxy: MethodProxy[[DataProto], DataProto] = wg.update_actor
    assert_type(proxy(batch), DataProto)
    # The group's own attributes are untouched.
    assert_type(wg.world_size, int)


def inferred_from_the_constructor(batch: DataProto) -> None:
    from sc_core import ClassWithInitArgs, ResourcePool

    wg = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Actor))
    assert_type(wg, LocalWorkerGroup[Actor])
    assert_type(wg.update_actor(batch), DataProto)


def in_a_with_block(batch: DataProto) -> None:
    from sc_core import ClassWithInitArgs, ResourcePool

    with LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Actor)) as wg:
        assert_type(wg.update_actor(batch), DataProto)


def inherited_worker_methods(wg: LocalWorkerGroup[Actor]) -> None:
    # Worker's own registered methods are bound on every group.
    assert_type(wg.call(Actor.execute_func_rank_zero, len, [1]), Any)


def subclassed(wg: LocalWorkerGroup[PatientActor], batch: DataProto) -> None:
    assert_type(wg.update_actor(batch), DataProto)
    assert_type(wg.init_model("/p"), list[int])


def any_backend(wg: WorkerGroup[Actor], batch: DataProto) -> None:
    assert_type(wg.update_actor(batch), DataProto)


def unknown_worker_class(wg: LocalWorkerGroup, batch: DataProto) -> None:
    # A group whose worker class the checker does not know stays untyped.
    assert_type(wg.update_actor(batch), Any)
    assert_type(wg.anything_at_all, Any)
