"""A simulated cluster of two nodes on this machine (``ray.cluster_utils.Cluster``): ranks
follow node order, and a re-created group keeps the same rank <-> node mapping."""

from __future__ import annotations

import pytest
from sc_core import Worker
from sc_dispatch import Dispatch, register
from sc_ray import (
    InsufficientResourcesError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayResourcePoolError,
    RayWorkerGroup,
    ResourcePoolManager,
)
from sc_ray import _ray_api as rapi

pytestmark = [pytest.mark.timeout(150), pytest.mark.usefixtures("no_leaks")]

#: two nodes of 2 CPUs each (conftest's ``simulated_cluster``)
SIMULATED_NODES = [{"num_cpus": 2}, {"num_cpus": 2}]


@pytest.fixture(scope="module")
def ray_cluster(simulated_cluster: tuple[rapi.SimulatedCluster, list[str]]) -> list[str]:
    """Overrides the single-node cluster: ``SIMULATED_NODES``; their node ids."""
    return simulated_cluster[1]


class WhereAmI(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def node(self) -> str:
        return rapi.current_node_id()


def _node_order() -> list[str]:
    """Node ids in the order sc-ray sorts placement groups: by IP, then node id."""
    nodes = [n for n in rapi.list_nodes() if n.alive]
    return [n.node_id for n in sorted(nodes, key=lambda n: (n.ip, n.node_id))]


def test_ranks_follow_node_order_and_stay_put(ray_cluster: list[str]) -> None:
    order = _node_order()
    assert sorted(order) == sorted(ray_cluster)
    mappings = []
    for _ in range(2):
        with RayWorkerGroup(
            RayResourcePool([2, 2], use_gpu=False), RayClassWithInitArgs(WhereAmI)
        ) as wg:
            mappings.append(wg.node())
    first, second = mappings
    assert first == [order[0], order[0], order[1], order[1]]
    assert second == first


def test_pool_that_fits_no_single_node_is_refused(ray_cluster: list[str]) -> None:
    # 3 processes fit the cluster (4 CPUs) but no single node (2 CPUs each).
    with pytest.raises(RayResourcePoolError, match="on one node"):
        ResourcePoolManager({"p": [3]}, {"A": "p"}, use_gpu=False).create_resource_pool()
    pool = RayResourcePool([3], use_gpu=False, placement_timeout_s=60)
    with pytest.raises(
        InsufficientResourcesError, match=r"puts 3 processes on one node, asking CPU=3"
    ):
        pool.get_placement_groups()  # at once: no waiting for the 60 s deadline
