"""Shared set-up for the integration tests.

pytest runs with ``--import-mode=importlib``, which leaves ``sys.path`` alone, so the test
modules could not import their shared helpers (``_trainer_runs``) by name. This directory
is put on ``sys.path`` once, here, before any test module is imported.

``ray_cluster``: the Ray tests of one module share one local cluster of 4 CPUs, started for
the module and shut down after it. ``publisher``: a weight publisher (in a temporary run
folder) over the module's own ``fleet`` fixture of engine servers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sc_trainer.rollout import RolloutServerFleet, WeightPublisher

_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

# Workers run with the interpreter of the test process (not through `uv run`); Ray reads this
# when it is first imported.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def publisher(
    fleet: RolloutServerFleet, tmp_path_factory: pytest.TempPathFactory
) -> WeightPublisher:
    from sc_trainer.rollout import WeightPublisher  # here: after Ray's variable above is set

    return WeightPublisher(tmp_path_factory.mktemp("run"), fleet.router)
