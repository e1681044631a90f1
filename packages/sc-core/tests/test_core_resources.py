"""ResourcePool and ClassWithInitArgs."""

from __future__ import annotations

import pytest
from _core_fakes import PROPERTY
from hypothesis import given
from hypothesis import strategies as st
from sc_core import ClassWithInitArgs, InvalidConfigError, ResourcePool, ResourcePoolError


def test_pool_layout() -> None:
    pool = ResourcePool([2, 3], max_colocate_count=1, n_gpus_per_node=4)
    assert pool.world_size == 5
    assert pool.store == [2, 3]
    assert pool() == [2, 3]
    assert pool.local_world_size_list() == [2, 2, 3, 3, 3]
    assert pool.local_rank_list() == [0, 1, 0, 1, 2]
    assert "process_on_nodes=[2, 3]" in repr(pool)
    pool.store.append(9)  # a copy
    assert pool.world_size == 5


@PROPERTY
@given(st.lists(st.integers(min_value=1, max_value=6), min_size=1, max_size=5))
def test_local_lists_cover_every_rank(counts: list[int]) -> None:
    pool = ResourcePool(counts)
    assert len(pool.local_rank_list()) == pool.world_size == sum(counts)
    assert all(
        r < s for r, s in zip(pool.local_rank_list(), pool.local_world_size_list(), strict=True)
    )


def test_add_node() -> None:
    pool = ResourcePool()
    assert pool.world_size == 0
    pool.add_node(2)
    assert pool.local_rank_list() == [0, 1]
    with pytest.raises(ResourcePoolError, match=r"add_node: process_count must be positive, got 0"):
        pool.add_node(0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"process_on_nodes": []}, "process_on_nodes is empty"),
        ({"process_on_nodes": [2, 0]}, r"process_on_nodes\[1\] must be positive, got 0"),
        ({"process_on_nodes": [-1]}, r"process_on_nodes\[0\] must be positive"),
        ({"process_on_nodes": [1.5]}, "must be a positive int, got float"),
        ({"process_on_nodes": [True]}, "must be a positive int, got bool"),
        ({"process_on_nodes": "22"}, "must be a sequence of ints"),
        ({"process_on_nodes": 4}, "must be a sequence of ints"),
        ({"process_on_nodes": [1], "max_colocate_count": 0}, "max_colocate_count"),
        ({"process_on_nodes": [1], "n_gpus_per_node": -8}, "n_gpus_per_node"),
    ],
)
def test_invalid_pools(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ResourcePoolError, match=match):
        ResourcePool(**kwargs)  # type: ignore[arg-type]


def test_class_with_init_args() -> None:
    cia: ClassWithInitArgs[dict[str, int]] = ClassWithInitArgs(dict, a=2)
    assert cia.args == ()
    assert cia.kwargs == {"a": 2}
    assert cia.fused_worker_used is False
    assert "dict" in repr(cia)
    built: list[int] = ClassWithInitArgs(list, [1, 2])()
    assert built == [1, 2]
    with pytest.raises(InvalidConfigError, match="cls must be a class"):
        ClassWithInitArgs(3)  # type: ignore[arg-type]
