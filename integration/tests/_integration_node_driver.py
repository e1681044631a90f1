"""A driver process for the node-loss tests: one tiny run on a standing two-node cluster.

    python _integration_node_driver.py OUTPUT_DIR '{"nnodes": 2, "workers_per_role": 2}'

connects to the cluster of ``RAY_ADDRESS`` (a plain run, not detached: the driver connects
first, and the run's launcher finds Ray initialised), runs
:func:`sc_trainer.testing.tiny_config` with those overrides through ``TaskRunner`` and prints
the result as one JSON line. Two options are the driver's, not the run's:

* ``"hold"``: resources (``{"CPU": 1, "node_a": 1}``) this driver reserves, in a placement
  group of its own, before the run places its pools, so that the run's bundles go where
  the rest is free (one on each node);
* ``"release_hold"``: ``true`` gives them back once the run's workers are placed (the
  capacity a lost node's bundles can move to), ``false`` keeps them to the end (none).

When the run's workers are placed (``fit`` begins), the driver writes
``OUTPUT_DIR/placement.json``: the node of every named actor of the run, the node the
driver is connected to, and each node's custom resources; after each recovery in place,
``OUTPUT_DIR/placement-recovery<N>.json`` (the replaced ranks' new actors included). Each
phase of a step is logged as it begins (``step 3: update_actor begins``, the trainer's DEBUG
line), so a test can lose a node inside a phase.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sc_trainer import TaskRunner
from sc_trainer.launch._connect import connect_to_cluster
from sc_trainer.testing import tiny_config

#: the resource names that tell the test cluster's nodes apart
NODE_RESOURCES = ("node_a", "node_b")


def _placement(ray: Any) -> dict[str, Any]:
    """Where the run's actors are: ``{"actors": {name: node_id}, "driver_node": id,
    "nodes": {node_id: [its NODE_RESOURCES]}}``."""
    actors = {}
    for name in ray.util.list_named_actors():
        try:
            actor = ray.get_actor(name)
            where = actor.__ray_call__.remote(lambda _self: ray.get_runtime_context().get_node_id())
            actors[name] = ray.get(where, timeout=60)
        except (ValueError, ray.exceptions.RayActorError):
            continue  # gone (a dead rank's actor)
    nodes = {
        node["NodeID"]: [r for r in NODE_RESOURCES if r in node["Resources"]]
        for node in ray.nodes()
        if node["Alive"]
    }
    return {
        "actors": actors,
        "driver_node": ray.get_runtime_context().get_node_id(),
        "nodes": nodes,
    }


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("sc_trainer.faults._driver").setLevel(logging.DEBUG)  # phases begin
    output_dir, raw = argv
    options: dict[str, Any] = json.loads(raw)
    hold: dict[str, float] | None = options.pop("hold", None)
    release_hold = bool(options.pop("release_hold", True))
    ray = connect_to_cluster(None, namespace="sc-node-loss", log_to_driver=False)
    held = None
    if hold:
        held = ray.util.placement_group([hold], strategy="STRICT_PACK")
        ray.get(held.ready(), timeout=120)

    def on_start(step: int) -> None:
        nonlocal held
        where = _placement(ray)
        if held is not None and release_hold:
            ray.util.remove_placement_group(held)
            held = None
        (Path(output_dir) / "placement.json").write_text(json.dumps(where))

    def progress(step: int, metrics: Mapping[str, Any]) -> None:
        if "recovery/count" in metrics and "step" not in metrics:
            # just recovered (the trainer reports the recovery on its own): where the
            # replaced ranks run now
            count = metrics["recovery/count"]
            (Path(output_dir) / f"placement-recovery{count}.json").write_text(
                json.dumps(_placement(ray))
            )

    started = time.monotonic()
    runner = TaskRunner(tiny_config(Path(output_dir), **options))
    result = runner.run(progress=progress, on_start=on_start)
    summary = {
        "final_step": result.final_step,
        "checkpoint": str(result.checkpoint),
        "seconds": time.monotonic() - started,
    }
    print(json.dumps(summary))  # noqa: T201
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
