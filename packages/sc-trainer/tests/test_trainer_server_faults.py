"""Recovery in place with engine servers (``rollout_engine="builtin"``, two servers behind a
router, on Ray): a dead worker (the actor's rank, as a step begins), a dead engine server (its
process killed, which the router restarts and re-syncs), both in one step, and a dead worker
under partial rollout. The servers' weight versions only grow, so after a recovery restores an
older checkpoint the restored weights are pushed under the next weight version, and the
batches still report actor versions (``EngineServers``).

Each run ends with weights bit-identical to the run without a fault: a step's requests are
named ``s<step>-<row>``, which seeds their sampling, so the replayed steps sample what the
uninterrupted run sampled (the built-in engine computes each request's tokens the same way
whatever else it decodes beside them, in float32 on the CPU).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _trainer_runs import final_weights, run, tiny_config
from sc_trainer import RunResult, TrainerConfig
from sc_trainer.testing import metric_differences

pytestmark = [pytest.mark.timeout(420)]


def _config(tmp_path: Path, **overrides: Any) -> TrainerConfig:
    settings: dict[str, Any] = {
        "rollout_engine": "builtin",
        "rollout_servers": 2,
        "algorithm": "grpo",
        "steps": 4,
        "save_every": 2,
        "val_every": 4,
        "max_recoveries": 2,
        # written before the step goes on: a recovery goes back to step 2 (the fault matrix
        # covers deaths while a checkpoint is written in the background)
        "background_checkpoints": False,
    }
    settings.update(overrides)
    return tiny_config(tmp_path, **settings)


def _without_recovery(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if not k.startswith("recovery/")} for r in history]


def _assert_same_run(faulty: RunResult, clean: RunResult) -> None:
    steps = [r["step"] for r in faulty.history]
    assert steps == sorted(set(steps)), f"a step was recorded twice: {steps}"
    assert metric_differences(_without_recovery(faulty.history), clean.history) == []
    theirs, mine = final_weights(clean.checkpoint), final_weights(faulty.checkpoint)
    assert theirs.keys() == mine.keys()
    different = [k for k in theirs if not torch.equal(theirs[k], mine[k])]
    assert not different, different


@pytest.fixture(scope="module")
def clean(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(_config(tmp_path_factory.mktemp("clean")))


@pytest.fixture(scope="module")
def clean_partial(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    return run(_config(tmp_path_factory.mktemp("clean-partial"), async_staleness=1))


@pytest.mark.fault_matrix
def test_a_dead_worker_with_engine_servers_recovers_bit_identically(
    clean: RunResult, tmp_path: Path
) -> None:
    faulty = run(_config(tmp_path, inject_fault="actor:0@step=3"))
    recovered = [r for r in faulty.history if "recovery/count" in r]
    assert [r["recovery/from_step"] for r in recovered] == [2]
    _assert_same_run(faulty, clean)


@pytest.mark.fault_matrix
def test_a_dead_engine_server_is_restarted_and_the_run_is_unchanged(
    clean: RunResult, tmp_path: Path
) -> None:
    faulty = run(_config(tmp_path, inject_fault="server:1@step=2"))
    assert not any("recovery/count" in r for r in faulty.history), "no worker died"
    _assert_same_run(faulty, clean)


@pytest.mark.fault_matrix
def test_a_dead_worker_and_a_dead_server_in_one_step(clean: RunResult, tmp_path: Path) -> None:
    faulty = run(_config(tmp_path, inject_fault="actor:0@step=3,server:0@step=3"))
    _assert_same_run(faulty, clean)


@pytest.mark.fault_matrix
def test_a_dead_worker_under_partial_rollout(clean_partial: RunResult, tmp_path: Path) -> None:
    """Partial rollout's trajectories span weight versions, at the point where a push lands
    mid-generation: timing, which a replay cannot reproduce (a step replayed after the
    recovery generates from the restored weights alone). So the recovered run is checked for
    what partial rollout promises: every step recorded once, every batch within the staleness
    bound, counted in actor versions (not the servers' push versions), and the run ends."""
    faulty = run(_config(tmp_path, async_staleness=1, inject_fault="actor:0@step=3"))
    steps = [r["step"] for r in faulty.history]
    assert steps == sorted(set(steps)) == [0, 1, 2, 3, 4]
    recovered = [r for r in faulty.history if "recovery/count" in r]
    assert [r["recovery/from_step"] for r in recovered] == [2]
    trained = [r for r in faulty.history if "train/reward" in r]
    assert all(0 <= r["rollout/staleness"] <= 1 for r in trained), trained
    versions = [r["rollout/weight_version"] for r in trained]
    assert all(r["step"] - 2 <= v <= r["step"] - 1 for r, v in zip(trained, versions, strict=True))
    assert faulty.final_step == clean_partial.final_step == 4


def test_server_faults_are_checked(tmp_path: Path) -> None:
    from sc_trainer.config import TrainerConfigError

    with pytest.raises(TrainerConfigError, match="a server fault needs engine servers"):
        tiny_config(tmp_path, inject_fault="server:0@step=2")
    with pytest.raises(TrainerConfigError, match=r"server 2 is outside the run's 2 servers"):
        _config(tmp_path, inject_fault="server:2@step=2")
    with pytest.raises(TrainerConfigError, match="takes no method"):
        _config(tmp_path, inject_fault="server:0@step=2:generate")
