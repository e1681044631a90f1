"""A node lost under a worker group (``ray.cluster_utils.Cluster``, nodes on this machine).

The head has 2 CPUs; each test adds a node of 1 CPU and places a pool of one rank per node
(``[1, 1]``) while holding the head's second CPU, so that each node gets a rank. Then the
added node is lost, with no graceful shutdown, and ``replace_ranks`` replaces its rank:

* with the held CPU given back, the node is lost with :class:`NodeLoss` (its raylet and every
  process below it SIGKILLed): a call finds the rank unreachable at once, the replacement
  waits until the cluster reports it dead (health checks) and Ray places the lost node's
  placement group on the head, and the new actor starts there; the group's spare on the
  lost node died with it, and is replaced by a new one rather than handed the rank;
* with the CPU still held (the node lost with ``ray.cluster_utils``' ``remove_node``, and
  the replacement called once the cluster found the rank dead), the replacement waits up to
  the pool's placement deadline and raises :class:`RankPlacementTimeoutError` naming the
  group, the rank and the missing CPU, before any new actor is created; the rank stays dead.
"""

from __future__ import annotations

import time

import pytest
from sc_core import Worker, WorkerDiedError
from sc_dispatch import Dispatch, register
from sc_ray import (
    NodeLoss,
    NodeLossError,
    PlacementTimeoutError,
    RankPlacementTimeoutError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
)
from sc_ray import _ray_api as rapi

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("no_leaks")]

#: a head of 2 CPUs (resource ``head``), the driver's (conftest's ``simulated_cluster``)
SIMULATED_NODES = [{"num_cpus": 2, "resources": {"head": 2}}]

#: how long the cluster may take to find a lost node's actors dead (its health checks)
DEATH_WAIT_S = 120.0


@pytest.fixture(scope="module")
def ray_cluster(
    simulated_cluster: tuple[rapi.SimulatedCluster, list[str]],
) -> rapi.SimulatedCluster:
    """Overrides the single-node cluster: ``SIMULATED_NODES``, the driver's."""
    return simulated_cluster[0]


class WhereAmI(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def node(self) -> str:
        return rapi.current_node_id()


def _hold_a_head_cpu(name: str) -> rapi.PlacementGroup:
    """Reserve one of the head's CPUs (so a pool of one rank per node spreads)."""
    pg = rapi.create_placement_group([{"CPU": 1, "head": 1}], "STRICT_PACK", name, None)
    assert rapi.wait_placement_group(pg, 60)
    return pg


def _group(name: str, placement_timeout_s: float, standby: int = 0) -> RayWorkerGroup:
    pool = RayResourcePool(
        [1, 1], use_gpu=False, name_prefix=name, placement_timeout_s=placement_timeout_s
    )
    return RayWorkerGroup(pool, RayClassWithInitArgs(WhereAmI), name_prefix=name, standby=standby)


def _lose(cluster: rapi.SimulatedCluster, node: str, wg: RayWorkerGroup, rank: int) -> None:
    """Lose ``node`` and wait until the cluster reports ``rank``'s actor dead."""
    cluster.remove_node(node)
    deadline = time.monotonic() + DEATH_WAIT_S
    while rank in wg.alive_ranks():
        assert time.monotonic() < deadline, f"rank {rank} not dead {DEATH_WAIT_S} s after"
        time.sleep(0.2)


def test_a_lost_nodes_rank_is_replaced_where_ray_places_its_bundle_again(
    ray_cluster: rapi.SimulatedCluster,
) -> None:
    head = rapi.current_node_id()
    other = ray_cluster.add_node(num_cpus=1)
    hold = _hold_a_head_cpu("nl_hold1")
    with _group("nl_room_", 120, standby=2) as wg:
        wg.wait_for_standby()
        where = wg.node()
        assert sorted(where) == sorted([head, other])
        assert wg.worker_node_ids() == where  # from the actor table
        lost = where.index(other)
        with pytest.raises(NodeLossError, match="the driver's own node"):
            NodeLoss.of_rank(wg, 1 - lost)
        loss = NodeLoss.of_rank(wg)  # the rank not on the driver's node
        assert loss.node_id == other
        rapi.remove_placement_group(hold)  # room on the head for the lost bundle
        started = time.monotonic()
        loss.fire()
        assert time.monotonic() - started < 30
        with pytest.raises(WorkerDiedError):  # unreachable at once, not yet reported dead
            wg.node()
        assert wg.dead_ranks == [lost]
        started = time.monotonic()
        assert wg.replace_ranks() == [lost]
        assert time.monotonic() - started < DEATH_WAIT_S
        assert wg.node() == [head, head]
        assert wg.worker_names[lost].endswith("-g1")  # a new actor, not the dead spare
        assert len(wg.standby_names) == 2  # the dead spare replaced by a new one
        wg.wait_for_standby(timeout=120)


@pytest.mark.extended
def test_no_room_for_a_lost_nodes_rank_is_a_placement_error_naming_it(
    ray_cluster: rapi.SimulatedCluster,
) -> None:
    other = ray_cluster.add_node(num_cpus=1)
    hold = _hold_a_head_cpu("nl_hold2")
    try:
        with _group("nl_full_", 3) as wg:
            lost = wg.node().index(other)
            _lose(ray_cluster, other, wg, lost)
            started = time.monotonic()
            with pytest.raises(RankPlacementTimeoutError) as info:
                wg.replace_ranks()
            assert time.monotonic() - started < 30
            error = info.value
            assert isinstance(error, PlacementTimeoutError)
            assert isinstance(error, TimeoutError)
            assert (error.group, error.ranks, error.timeout_s) == ("nl_full_", (lost,), 3)
            assert error.asked == {"CPU": 1.0}
            assert error.missing == {"CPU": 1.0}
            message = str(error)
            assert "RayWorkerGroup 'nl_full_'.replace_ranks" in message
            assert f"rank {lost} (bundle 0 of node {lost} of pool [1, 1])" in message
            assert "within 3 s" in message
            assert "missing {CPU: 1}" in message
            assert "SC_RAY_PLACEMENT_TIMEOUT_S" in message
            assert wg.dead_ranks == [lost]  # nothing was started; the rank stays dead
    finally:
        rapi.remove_placement_group(hold)
