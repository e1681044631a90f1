"""The trainer on a simulated two-node Ray cluster (``ray.cluster_utils.Cluster``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest
import ray
from _trainer_runs import assert_finite_training_metrics, tiny_config
from ray.cluster_utils import Cluster
from sc_trainer import TaskRunner, make_launcher
from sc_trainer.runs import read_metrics

pytestmark = pytest.mark.timeout(240)

ray_api: Any = ray  # Ray's cluster helpers are untyped


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[Cluster]:
    """Two nodes of one CPU each: a pool of two one-CPU workers must use both."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cast(Any, cluster).shutdown()


def _node_of(actor: Any) -> str:
    """The node an actor runs on (asked inside the actor)."""
    node: str = ray.get(
        actor.__ray_call__.remote(lambda _self: ray_api.get_runtime_context().get_node_id())
    )
    return node


def test_ppo_spans_two_nodes(two_nodes: Cluster, tmp_path: Path) -> None:
    assert len([n for n in ray_api.nodes() if n["Alive"]]) == 2
    cfg = tiny_config(tmp_path, workers_per_role=2, nnodes=2, steps=2)
    runner = TaskRunner(cfg)
    assert runner.resource_pool_spec()[0] == {"global_pool": [1, 1]}
    trainer = runner.build_trainer(make_launcher(cfg))
    try:
        trainer.init_workers()
        nodes = [_node_of(w) for w in trainer.actor_rollout_wg.workers]
        assert len(set(nodes)) == 2
        result = trainer.fit()
    finally:
        trainer.close()
    assert result.final_step == 2
    assert_finite_training_metrics(read_metrics(result.output.metrics_path), critic=True)
