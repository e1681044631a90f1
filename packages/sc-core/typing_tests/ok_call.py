"""Correct calls in the plugin-free spelling: mypy (with and without the plugin) and pyright
must accept this file, and every ``assert_type`` must hold."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from _typing_workers import Actor, DataProto, PatientActor, identity, make_group
from sc_core import LocalWorkerGroup, MethodProxy

if TYPE_CHECKING:
    from typing_extensions import assert_type


def calls(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    assert_type(wg.call(Actor.init_model, "/ckpt"), list[int])
    assert_type(wg.call(Actor.init_model, path="/ckpt", strict=False), list[int])
    assert_type(wg.call(Actor.update_actor, batch), DataProto)
    assert_type(wg.call(Actor.apply, identity, batch), DataProto)
    assert_type(wg.call(Actor.metrics, batch), list[dict[str, float]])
    assert_type(wg.call(Actor.save, "/out"), str)
    assert_type(wg.call(Actor.per_rank, [1, 2]), list[float])
    assert_type(wg.call(Actor.default_mode, [1, 2]), list[int])
    assert_type(wg.call(Actor.ping, "x"), list[str])
    assert_type(wg.call(Actor.generate, batch), Any)
    assert_type(wg.call(Actor.compute_log_prob, batch), DataProto)
    assert_type(wg.call(Actor.custom, 3), list[str])
    assert_type(wg.call(Actor.explicit_execute, 3), Any)
    assert_type(wg.call(Actor.counted, 3), Any)
    # A ONE_TO_ALL result is a list: index it, iterate it.
    first: int = wg.call(Actor.init_model, "/ckpt")[0]
    total = sum(wg.call(Actor.init_model, "/ckpt"))
    assert_type(total, int)
    del first, total


def proxies(wg: LocalWorkerGroup[Actor], batch: DataProto) -> None:
    update = wg.method(Actor.update_actor)
    assert_type(update(batch), DataProto)
    assert_type(update.options(timeout=30)(batch), DataProto)
    assert_type(update.options(blocking=False)(batch), Any)
    assert_type(wg.method(Actor.init_model).options(timeout=None)("/p"), list[int])
    per_rank: MethodProxy[..., list[float]] = wg.method(Actor.per_rank)
    assert_type(per_rank([1, 2]), list[float])


def subclassed(wg: LocalWorkerGroup[PatientActor], batch: DataProto) -> None:
    assert_type(wg.call(PatientActor.update_actor, batch), DataProto)
    assert_type(wg.call(PatientActor.init_model, "/p"), list[int])


def worker_side(actor: Actor, batch: DataProto) -> None:
    # The decorated methods keep their own signatures on the worker.
    assert_type(actor.update_actor(batch), DataProto)
    assert_type(actor.init_model("/p"), int)
    assert_type(Actor.save(actor, "/p"), str)


if __name__ == "__main__":
    group = make_group()
    calls(group, DataProto(4))
