"""ResourcePoolManager: named pools for roles, the backend hooks, typed errors."""

from __future__ import annotations

import enum
from typing import Any

import pytest
from _core_fakes import PROPERTY, EchoWorker
from hypothesis import given
from hypothesis import strategies as st
from sc_core import (
    ClassWithInitArgs,
    ConfigTypeError,
    LocalWorkerGroup,
    ResourcePool,
    ResourcePoolError,
    ResourcePoolManager,
    UnknownRoleError,
)


class Role(enum.Enum):
    Actor = "actor"
    Rollout = "rollout"
    Critic = "critic"
    Reward = "reward"


def test_roles_share_the_pool_they_map_to() -> None:
    manager = ResourcePoolManager(
        {"global_pool": [2, 1], "critic_pool": [1]},
        {Role.Actor: "global_pool", Role.Rollout: "global_pool", Role.Critic: "critic_pool"},
    )
    assert manager.get_n_gpus() == 4
    assert manager.resource_pool_dict == {}
    manager.create_resource_pool()
    actor = manager.get_resource_pool(Role.Actor)
    assert type(actor) is ResourcePool
    assert actor is manager.get_resource_pool(Role.Rollout)
    assert actor is not manager.get_resource_pool(Role.Critic)
    assert actor.store == [2, 1]
    assert actor.max_colocate_count == 1
    assert sorted(manager.resource_pool_dict) == ["critic_pool", "global_pool"]
    assert "created=['critic_pool', 'global_pool']" in repr(manager)
    manager.release()  # in-process pools hold nothing


def test_a_pool_runs_a_local_worker_group() -> None:
    manager = ResourcePoolManager({"p": [3]}, {"adder": "p"}, n_gpus_per_node=4)
    manager.create_resource_pool()
    pool = manager.get_resource_pool("adder")
    assert pool.n_gpus_per_node == 4
    wg = LocalWorkerGroup(pool, ClassWithInitArgs(EchoWorker, "t"))
    try:
        assert [rank for rank, _, _ in wg.call(EchoWorker.one_to_all, 5)] == [0, 1, 2]
    finally:
        wg.close()


def test_unknown_role_is_a_key_error_naming_the_role() -> None:
    manager = ResourcePoolManager({"p": [1]}, {Role.Actor: "p"})
    manager.create_resource_pool()
    with pytest.raises(KeyError, match=r"get_resource_pool: role <Role.Reward: 'reward'>") as info:
        manager.get_resource_pool(Role.Reward)
    assert isinstance(info.value, UnknownRoleError)
    assert "Role.Actor" in str(info.value)


def test_a_pool_used_before_it_is_created() -> None:
    manager = ResourcePoolManager({"p": [1]}, {"a": "p"})
    with pytest.raises(ResourcePoolError, match=r"pool 'p' is not created yet"):
        manager.get_resource_pool("a")


@pytest.mark.parametrize(
    ("spec", "mapping", "match"),
    [
        ({"p": [1]}, {"a": "q"}, r"mapping names pools \['q'\] that resource_pool_spec"),
        ({"p": []}, {}, r"pool 'p': process_on_nodes must be a non-empty list"),
        ({"p": [0]}, {}, r"got \[0\]"),
        ({"p": [True]}, {}, r"got \[True\]"),
        ({"p": "2"}, {}, r"got '2'"),
        ({"": [1]}, {}, r"pool names must be non-empty str"),
        ({3: [1]}, {}, r"got int 3"),
    ],
)
def test_bad_specs_are_resource_pool_errors(
    spec: dict[Any, Any], mapping: dict[Any, str], match: str
) -> None:
    with pytest.raises(ResourcePoolError, match=match):
        ResourcePoolManager(spec, mapping)


def test_bad_argument_types_are_type_errors() -> None:
    with pytest.raises(ConfigTypeError, match=r"resource_pool_spec must be a mapping"):
        ResourcePoolManager([("p", [1])], {})  # type: ignore[arg-type]
    with pytest.raises(ConfigTypeError, match=r"mapping must be a mapping"):
        ResourcePoolManager({"p": [1]}, [("a", "p")])  # type: ignore[arg-type]
    with pytest.raises(ResourcePoolError, match=r"max_colocate_count must be a positive int"):
        ResourcePoolManager({"p": [1]}, {}, max_colocate_count=0)


class _Tagged(ResourcePool):
    """A backend's pool class."""

    def __init__(self, name: str, counts: list[int]) -> None:
        super().__init__(counts)
        self.name = name


class _BackendError(ResourcePoolError):
    """A backend's own pool error."""


class _BackendManager(ResourcePoolManager[_Tagged]):
    pool_class = _Tagged
    error_class = _BackendError

    def __init__(self, *args: Any, capacity: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.capacity = capacity

    def _new_pool(self, name: str, process_on_nodes: list[int]) -> _Tagged:
        return _Tagged(name, process_on_nodes)

    def _check_resource_available(self) -> None:
        if self.get_n_gpus() > self.capacity:
            raise _BackendError(f"asks {self.get_n_gpus()}, have {self.capacity}")


def test_a_backend_specialises_the_hooks() -> None:
    manager = _BackendManager({"p": [2], "q": [1]}, {"a": "p"}, capacity=3)
    manager.create_resource_pool()
    pool = manager.get_resource_pool("a")  # typed _Tagged
    assert pool.name == "p"
    with pytest.raises(_BackendError, match=r"asks 3, have 2"):
        _BackendManager({"p": [2], "q": [1]}, {"a": "p"}, capacity=2).create_resource_pool()
    with pytest.raises(_BackendError, match=r"does not define"):
        _BackendManager({"p": [2]}, {"a": "x"}, capacity=2)


class _Forgetful(ResourcePoolManager[_Tagged]):
    """Changes the pool class without building it."""

    pool_class = _Tagged


def test_a_pool_of_the_wrong_class_is_refused() -> None:
    with pytest.raises(ConfigTypeError, match=r"_new_pool\('p'\) built a ResourcePool"):
        _Forgetful({"p": [1]}, {}).create_resource_pool()


@PROPERTY
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=4),
        st.lists(st.integers(min_value=1, max_value=4), min_size=1, max_size=3),
        min_size=1,
        max_size=4,
    ),
    st.data(),
)
def test_every_role_gets_the_pool_of_its_name(
    spec: dict[str, list[int]], data: st.DataObject
) -> None:
    names = sorted(spec)
    mapping = {f"role{i}": data.draw(st.sampled_from(names)) for i in range(4)}
    manager = ResourcePoolManager(spec, mapping)
    manager.create_resource_pool()
    assert manager.get_n_gpus() == sum(map(sum, spec.values()))
    for role, name in mapping.items():
        pool = manager.get_resource_pool(role)
        assert pool is manager.resource_pool_dict[name]
        assert pool.store == spec[name]
