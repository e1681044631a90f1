"""Colocation: several roles in one worker, exposed as role_method, and spawn; verl's fused
worker (raw class, subclasses of it, spawn/fuse of a fused group) in the in-process backend."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from _core_fakes import Batch
from sc_core import (
    ClassWithInitArgs,
    ColocationError,
    ConfigTypeError,
    LocalWorkerGroup,
    MethodCollisionError,
    ResourcePool,
    UnknownRoleError,
    Worker,
    WorkerError,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from sc_core.backend import register_class_unwrapper
from sc_dispatch import Dispatch, make_nd_compute_dataproto_dispatch_fn, register
from sc_dispatch.ext import MeshLayout, get_register_attrs


class Actor(Worker):
    def __init__(self, lr: float) -> None:
        super().__init__()
        self.lr = lr
        self._register_dispatch_collect_info("actor", self.rank, True)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float]:
        return ("actor", self.rank, self.lr)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def update(self, batch: Batch) -> Batch:
        return Batch([row * self.lr for row in batch.rows])

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def generate(self, n: int) -> list[int]:
        await asyncio.sleep(0)
        return [self.rank] * n


class Critic(Worker):
    def __init__(self, scale: int = 1) -> None:
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def describe(self) -> tuple[str, int, float]:
        return ("critic", self.rank, float(self.scale))

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def values(self, batch: Batch) -> Batch:
        return Batch([row * self.scale for row in batch.rows])


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup]:
    cia = create_colocated_worker_cls(
        {"actor": ClassWithInitArgs(Actor, 0.5), "critic": ClassWithInitArgs(Critic, scale=3)}
    )
    g = LocalWorkerGroup(ResourcePool([2]), cia)
    yield g
    g.close()


def test_roles_are_exposed_as_role_method(wg: LocalWorkerGroup) -> None:
    names = wg.bound_method_names
    for name in (
        "actor_describe",
        "actor_update",
        "actor_generate",
        "critic_describe",
        "critic_values",
    ):
        assert name in names
    assert wg.actor_describe() == [("actor", 0, 0.5), ("actor", 1, 0.5)]
    assert wg.critic_describe() == [("critic", 0, 3.0), ("critic", 1, 3.0)]
    assert wg.critic_values(Batch([1, 2, 3])) == Batch([3, 6, 9])


def test_register_attributes_and_async_are_kept() -> None:
    cls = create_colocated_worker_cls({"actor": ClassWithInitArgs(Actor, 1.0)}).cls
    attrs = get_register_attrs(cls.actor_generate)  # type: ignore[attr-defined]
    assert attrs is not None
    assert attrs.blocking is False
    assert asyncio.iscoroutinefunction(cls.actor_generate)  # type: ignore[attr-defined]
    assert cls.actor_describe.__name__ == "actor_describe"  # type: ignore[attr-defined]


def test_colocated_roles_share_one_worker_environment(wg: LocalWorkerGroup) -> None:
    for rank, worker in enumerate(wg.workers):
        actor, critic = worker.worker_dict["actor"], worker.worker_dict["critic"]
        assert actor.rank == critic.rank == worker.rank == rank
        assert actor._sc_environ() is worker._sc_environ()
        assert actor.get_master_addr_port() == worker.get_master_addr_port()


def test_async_non_blocking_role_method(wg: LocalWorkerGroup) -> None:
    futs = wg.actor_generate(2)
    assert [f.get() for f in futs] == [[0, 0], [1, 1]]


def test_spawn_rebinds_role_methods_under_plain_names(wg: LocalWorkerGroup) -> None:
    groups = wg.spawn({"actor", "critic"})
    actor, critic = groups["actor"], groups["critic"]
    assert actor.describe() == [("actor", 0, 0.5), ("actor", 1, 0.5)]
    assert critic.describe() == [("critic", 0, 3.0), ("critic", 1, 3.0)]
    assert critic.values(Batch([1, 2])) == Batch([3, 6])
    assert [f.get() for f in actor.generate(1)] == [[0], [1]]
    assert actor.describe.method_name == "actor_describe"
    assert "-> actor_describe" in repr(actor.describe)
    # Same workers, separate groups.
    assert actor.workers == wg.workers == critic.workers
    assert actor is not wg
    # The prefixed names still work on the spawned groups.
    assert critic.actor_describe()[0][0] == "actor"


def test_nd_dispatch_through_a_spawned_group_asks_the_role_instance(wg: LocalWorkerGroup) -> None:
    actor = wg.spawn(["actor"])["actor"]
    assert actor._query_dispatch_info("actor") == [0, 1]
    assert actor.update(Batch([2, 4, 6])) == Batch([1.0, 2.0, 3.0])
    assert actor._mesh_cache.layouts() == {"actor": MeshLayout((0, 1), (True, True))}
    assert wg._mesh_cache.layouts() == {}  # each group has its own cache


def test_spawn_errors(wg: LocalWorkerGroup) -> None:
    with pytest.raises(KeyError, match=r"unknown role 'ref'.*\['actor', 'critic'\]") as info:
        wg.spawn({"ref"})
    assert isinstance(info.value, UnknownRoleError)
    with pytest.raises(TypeError, match="collection of role names"):
        wg.spawn("actor")


class Plain(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ref_logp(self) -> int:
        return self.rank


def test_spawn_on_a_plain_group_uses_the_name_prefix() -> None:
    g = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Plain))
    try:
        assert g.spawn(["ref"])["ref"].logp() == [0]
        with pytest.raises(UnknownRoleError, match="no bound method starts with 'critic_'"):
            g.spawn(["critic"])
    finally:
        g.close()


class SpawnClash(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def x_spawn(self) -> int:
        return 0


def test_spawn_refuses_to_shadow_a_group_attribute() -> None:
    g = LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(SpawnClash))
    try:
        with pytest.raises(MethodCollisionError, match="'spawn'"):
            g.spawn(["x"])
    finally:
        g.close()


class A_B(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def c(self) -> int:
        return 0


class B_C(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def b_c(self) -> int:
        return 0


class RankZero(Worker):
    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero(self) -> int:
        return 0


class NotAWorker:
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hello(self) -> int:
        return 0


def _worker_dict(class_dict: Any) -> Any:
    return create_colocated_worker_cls(class_dict).cls


def test_colocation_errors() -> None:
    makers: tuple[Callable[[Any], Any], ...] = (
        _worker_dict,
        create_colocated_worker_raw_cls,
        create_colocated_worker_cls_fused,
    )
    for make in makers:
        with pytest.raises(ColocationError, match="class_dict is empty"):
            make({})
        with pytest.raises(TypeError, match="class_dict must be a mapping") as type_info:
            make([("a", ClassWithInitArgs(Plain))])
        assert isinstance(type_info.value, ConfigTypeError)
        with pytest.raises(ColocationError, match="identifiers, got 'a-b'"):
            make({"a-b": ClassWithInitArgs(Plain)})
        with pytest.raises(ConfigTypeError, match="role 'a' must map to a ClassWithInitArgs"):
            make({"a": Plain})
        with pytest.raises(TypeError, match=r"role 'a' runs .*<lambda>.*not a subclass of"):
            make({"a": ClassWithInitArgs(lambda: Plain())})
        with pytest.raises(TypeError, match=r"role 'x' runs NotAWorker, which is not a") as info:
            make({"x": ClassWithInitArgs(NotAWorker)})
        assert isinstance(info.value, ConfigTypeError)
    with pytest.raises(ColocationError, match=r"'a_b_c' is exposed by role 'a'.*and by role 'a_b'"):
        _worker_dict({"a_b": ClassWithInitArgs(A_B), "a": ClassWithInitArgs(B_C)})
    with pytest.raises(ColocationError, match="'execute_func_rank_zero', which is a Worker attr"):
        _worker_dict({"execute_func": ClassWithInitArgs(RankZero)})
    with pytest.raises(ColocationError, match="create_colocated_worker_raw_cls: role 'rank'"):
        create_colocated_worker_raw_cls({"rank": ClassWithInitArgs(Plain)})


class RayWrapped:
    """What a backend's actor class looks like to colocation: the user class behind an
    attribute (named differently from Ray's, which another test module registers)."""

    __fake_backend_class__ = Plain


def test_backend_wrapped_classes_are_unwrapped() -> None:
    # sc-core knows no backend's names: the backend registers how to find the user class
    with pytest.raises(ConfigTypeError, match="RayWrapped, which is not a subclass"):
        create_colocated_worker_cls({"ref": ClassWithInitArgs(RayWrapped)})
    register_class_unwrapper(lambda obj: getattr(obj, "__fake_backend_class__", None))
    with pytest.raises(ConfigTypeError, match="expected a callable"):
        register_class_unwrapper("nope")  # type: ignore[arg-type]
    g = LocalWorkerGroup(
        ResourcePool([2]), create_colocated_worker_cls({"ref": ClassWithInitArgs(RayWrapped)})
    )
    try:
        assert g.ref_ref_logp() == [0, 1]
    finally:
        g.close()


# --- the fused variant ---------------------------------------------------------------------


class Peer(Worker):
    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def hello(self) -> tuple[str, int]:
        return (self.name, self.rank)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peers(self) -> list[str]:
        return sorted(self.fused_worker_dict)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def ahello(self) -> str:
        await asyncio.sleep(0)
        return self.name

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def tag(self, batch: Batch) -> Batch:
        return Batch([(self.name, self.rank, row) for row in batch.rows])

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def first(self, value: int) -> tuple[str, int, int]:
        return (self.name, self.rank, value)


@pytest.fixture
def fused() -> Iterator[LocalWorkerGroup]:
    cia = create_colocated_worker_cls_fused(
        {"actor": ClassWithInitArgs(Peer, "a"), "critic": ClassWithInitArgs(Peer, name="c")}
    )
    g = LocalWorkerGroup(ResourcePool([2]), cia)
    yield g
    g.close()


def test_fused_worker_class_shape(fused: LocalWorkerGroup) -> None:
    worker = fused.workers[0]
    assert type(worker).__name__ == "FusedWorker_actor_critic"
    assert type(worker).is_fused_worker is True
    assert worker.actor.name == "a"
    assert worker.get_fused_worker_by_name("critic") is worker.critic
    assert worker.actor.fused_worker_dict is worker.fused_worker_dict
    assert "actor_hello" not in fused.bound_method_names


def test_spawn_fused_routes_calls_to_the_role(fused: LocalWorkerGroup) -> None:
    groups = fused.spawn_fused(["actor", "critic"])
    assert groups["actor"].hello() == [("a", 0), ("a", 1)]
    assert groups["critic"].hello() == [("c", 0), ("c", 1)]
    assert groups["critic"].peers() == [["actor", "critic"]] * 2
    assert groups["actor"].ahello() == ["a", "a"]
    assert groups["actor"]._fused_role == "actor"
    assert groups["critic"].tag(Batch([1, 2, 3])) == Batch([("c", 0, 1), ("c", 0, 2), ("c", 1, 3)])
    assert groups["actor"].first(7) == ("a", 0, 7)


def test_fuse_sets_one_attribute_per_role(fused: LocalWorkerGroup) -> None:
    fused.fuse(["actor", "critic"])
    fused.fuse(["actor", "critic"])  # again: nothing changes
    assert fused.actor.hello() == [("a", 0), ("a", 1)]
    assert fused.critic.hello() == [("c", 0), ("c", 1)]


def test_fused_errors(fused: LocalWorkerGroup) -> None:
    with pytest.raises(KeyError, match=r"unknown role 'ref'.*\['actor', 'critic'\]"):
        fused.spawn_fused(["ref"])
    with pytest.raises(TypeError, match="collection of role names"):
        fused.spawn_fused("actor")
    with pytest.raises(WorkerError, match=r"_fuw_execute \(rank 0\): expected") as info:
        fused.execute_all_sync("_fuw_execute", "nobody_fwmn_hello")
    assert isinstance(info.value, KeyError)  # the worker raised UnknownRoleError
    with pytest.raises(ConfigTypeError, match="is not a fused worker"):
        fused.spawn_fused(["actor"])["actor"].spawn_fused(["actor"])
    with pytest.raises(ColocationError, match="Worker attribute"):
        create_colocated_worker_cls_fused({"rank": ClassWithInitArgs(Peer, "x")})


class FusedClash(LocalWorkerGroup):
    actor = "taken"


def test_fuse_refuses_to_shadow_a_group_attribute() -> None:
    cia = create_colocated_worker_cls_fused({"actor": ClassWithInitArgs(Peer, "a")})
    g = FusedClash(ResourcePool([1]), cia)
    try:
        with pytest.raises(MethodCollisionError, match="fuse: role 'actor'"):
            g.fuse(["actor"])
    finally:
        g.close()


def test_colocation_module_holds_no_context_variable() -> None:
    # Ray ships a colocated class by value together with the module globals its methods
    # use; a ContextVar among them cannot be pickled, so it is referenced via its module.
    import contextvars

    from sc_core import _colocate

    held = [n for n, v in vars(_colocate).items() if isinstance(v, contextvars.ContextVar)]
    assert held == []


def test_spawned_groups_outlive_the_dropped_parent() -> None:
    import gc
    import weakref

    cia = create_colocated_worker_cls(
        {"actor": ClassWithInitArgs(Actor, 0.5), "critic": ClassWithInitArgs(Critic, scale=3)}
    )
    parent = LocalWorkerGroup(ResourcePool([2]), cia)
    parent_ref = weakref.ref(parent)
    groups = parent.spawn({"actor", "critic"})
    del parent
    gc.collect()  # the parent is reachable only through its spawned groups
    assert groups["actor"].describe() == [("actor", 0, 0.5), ("actor", 1, 0.5)]
    assert groups["critic"].values(Batch([1, 2])) == Batch([3, 6])
    del groups
    gc.collect()  # nothing else (not the rank threads) keeps the workers alive
    assert parent_ref() is None


# --- verl's fused-worker pattern: the raw fused class, subclassed ---------------------------


class FwActor(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def add(self, x: float) -> float:
        return x + self.rank


class FwCritic(Worker):
    def __init__(self, val: float) -> None:
        super().__init__()
        self.val = val

    @register(dispatch_mode=Dispatch.ALL_TO_ALL)
    def sub(self, x: float) -> float:
        return x - self.val


FW_ROLES: dict[str, ClassWithInitArgs[Any]] = {
    "actor": ClassWithInitArgs(FwActor),
    "critic": ClassWithInitArgs(FwCritic, val=10),
}
FusedBase = create_colocated_worker_raw_cls(FW_ROLES)


class Hybrid(FusedBase):  # type: ignore[misc,valid-type]
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def foo(self, x: float) -> float:
        out: float = self.critic.sub(self.actor.add(x))
        return out


def test_the_three_builders_match_verl() -> None:
    worker_dict = create_colocated_worker_cls(FW_ROLES)
    assert type(worker_dict) is ClassWithInitArgs
    assert worker_dict.fused_worker_used is False
    assert hasattr(worker_dict.cls, "actor_add")
    fused = create_colocated_worker_cls_fused(FW_ROLES)
    assert type(fused) is ClassWithInitArgs
    assert fused.fused_worker_used is True
    assert fused.args == ()
    assert fused.kwargs == {}
    raw = create_colocated_worker_raw_cls(FW_ROLES)
    assert isinstance(raw, type)
    assert issubclass(raw, Worker)
    assert raw.__name__ == "FusedWorker_actor_critic"
    assert raw.is_fused_worker is True  # type: ignore[attr-defined]
    assert raw.raw_cls_dict == {"actor": FwActor, "critic": FwCritic}  # type: ignore[attr-defined]
    assert not hasattr(raw, "actor_add")


@pytest.mark.parametrize("flag", [True, False])
def test_a_subclass_of_the_raw_fused_class_fuses_and_keeps_its_own_methods(flag: bool) -> None:
    # verl's tests/single_controller/test_fused_workers_on_cpu.py, in process; the class is
    # recognised as fused whether or not fused_worker_used is set.
    cia = ClassWithInitArgs(Hybrid)
    cia.fused_worker_used = flag
    with LocalWorkerGroup(ResourcePool([2]), cia) as wg:
        assert wg.fused_worker_used is flag
        assert "foo" in wg.bound_method_names
        assert not {"add", "sub", "actor_add"} & set(wg.bound_method_names)
        wg.fuse(FW_ROLES.keys())
        x = wg.actor.add(0.1)
        assert x == [0.1, 1.1]
        y = wg.critic.sub(x)
        assert y == pytest.approx([-9.9, -8.9])
        assert wg.foo(0.1) == pytest.approx(y)
        assert "add" in wg.actor.bound_method_names
        assert not {"sub", "foo"} & set(wg.actor.bound_method_names)
        assert "sub" in wg.critic.bound_method_names
        assert not {"add", "foo"} & set(wg.critic.bound_method_names)
        assert wg.wg_dict == {"actor": wg.actor, "critic": wg.critic}
        worker = wg.workers[1]
        assert isinstance(worker, Hybrid)
        assert worker.critic.val == 10
        assert worker.actor.fused_worker_dict is worker.fused_worker_dict
        assert worker.rank == worker.actor.rank == worker.critic.rank == 1


def test_spawn_of_a_fused_group_returns_one_fused_group_per_role() -> None:
    with LocalWorkerGroup(ResourcePool([2]), create_colocated_worker_cls_fused(FW_ROLES)) as wg:
        assert wg.fused_worker_used is True
        groups = wg.spawn(prefix_set={"actor", "critic"})
        assert sorted(groups) == ["actor", "critic"]
        assert groups["actor"]._fused_role == "actor"
        assert groups["actor"].add(1.0) == [1.0, 2.0]
        assert groups["critic"].sub([20.0, 30.0]) == [10.0, 20.0]
        with pytest.raises(UnknownRoleError, match=r"unknown role 'ref'.*\['actor', 'critic'\]"):
            wg.spawn(["ref"])
        with pytest.raises(ConfigTypeError, match="collection of role names"):
            wg.spawn("actor")


def test_fuse_of_a_worker_dict_group_uses_spawn() -> None:
    with LocalWorkerGroup(ResourcePool([2]), create_colocated_worker_cls(FW_ROLES)) as wg:
        wg.fuse(["actor", "critic"])
        assert wg.actor.add(1.0) == [1.0, 2.0]
        assert wg.critic.sub([20.0, 30.0]) == [10.0, 20.0]
        assert wg.actor._fused_role is None  # plain names over actor_add, no _fuw_execute


def test_fused_worker_used_errors() -> None:
    cia = ClassWithInitArgs(Plain)
    cia.fused_worker_used = True  # verl's flag on a class that is not fused
    with LocalWorkerGroup(ResourcePool([1]), cia) as wg:
        with pytest.raises(ConfigTypeError, match=r"Plain is not a fused worker \(the group's"):
            wg.spawn(["ref"])
        with pytest.raises(ConfigTypeError, match="Plain is not a fused worker"):
            wg.fuse(["ref"])
    cia.fused_worker_used = "yes"  # type: ignore[assignment]
    with pytest.raises(ConfigTypeError, match=r"fused_worker_used of .* must be a bool, got str"):
        LocalWorkerGroup(ResourcePool([1]), cia)


def test_fuw_execute_refuses_a_malformed_name() -> None:
    with LocalWorkerGroup(ResourcePool([1]), ClassWithInitArgs(Hybrid)) as wg:
        assert wg.execute_rank_zero_sync("_fuw_execute", "actor_fwmn_add", 2.0) == 2.0
        for bad in ("add", "ref_fwmn_add", 3):
            with pytest.raises(WorkerError, match=r"_fuw_execute \(rank 0\): expected") as info:
                wg.execute_rank_zero_sync("_fuw_execute", bad)
            assert isinstance(info.value, KeyError)


def test_a_subclass_of_the_fused_class_may_not_take_reserved_names() -> None:
    with pytest.raises(MethodCollisionError, match="_fuw_execute"):

        class Bad(FusedBase):  # type: ignore[misc,valid-type]
            def _fuw_execute(self, method_name: str) -> None:
                return None
