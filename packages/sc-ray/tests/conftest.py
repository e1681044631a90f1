"""Shared fixtures of sc-ray's tests: one local Ray cluster per test module, leak checks."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from sc_ray import _ray_api as rapi

os.environ.setdefault("RAY_DEDUP_LOGS", "0")


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """A local cluster for the whole module; ``RAY_INIT`` in the module sets its size."""
    kwargs: dict[str, Any] = dict(getattr(request.module, "RAY_INIT", {"num_cpus": 8}))
    if rapi.is_initialized():
        rapi.shutdown()
    rapi.init_local(**kwargs)
    try:
        yield
    finally:
        rapi.shutdown()


@pytest.fixture(scope="module")
def simulated_cluster(
    request: pytest.FixtureRequest,
) -> Iterator[tuple[rapi.SimulatedCluster, list[str]]]:
    """A cluster of simulated nodes for the whole module, connected in place of the local one
    (``SIMULATED_NODES`` in the module: each node's ``add_node`` keyword arguments); yields
    it and its node ids. A module's ``ray_cluster`` override builds on it."""
    nodes: list[dict[str, Any]] = request.module.SIMULATED_NODES
    if rapi.is_initialized():
        rapi.shutdown()
    cluster = rapi.SimulatedCluster()
    try:
        ids = [cluster.add_node(**node) for node in nodes]
        cluster.connect()
        yield cluster, ids
    finally:
        cluster.shutdown()


def _live() -> tuple[set[str], set[str]]:
    pgs = {k for k, (_, state) in rapi.placement_group_states().items() if state != "REMOVED"}
    actors = {k for k, a in rapi.actor_states().items() if a.state != "DEAD"}
    return pgs, actors


@pytest.fixture
def no_leaks(ray_cluster: None) -> Iterator[None]:
    """Fails the test if it leaves a placement group or an actor alive."""
    pgs_before, actors_before = _live()
    yield
    deadline = time.monotonic() + 15
    while True:
        pgs, actors = _live()
        new_pgs, new_actors = pgs - pgs_before, actors - actors_before
        if not new_pgs and not new_actors:
            return
        if time.monotonic() > deadline:
            states = rapi.actor_states()
            names = sorted(states[a].name or states[a].class_name for a in new_actors)
            pytest.fail(f"left behind: placement groups {sorted(new_pgs)}, actors {names}")
        time.sleep(0.2)
