"""Injected reward faults (``reward:P@step=N[:raise|hang]``) on a dataset run: a reward call
that raises or hangs mid-run stops the run naming the dataset row, losing none of the steps
before it (a resumed run ends where the uninterrupted one does), or, when the run counts
failures, scores the row 0.0 and counts it in that step's metrics only."""

from __future__ import annotations

from pathlib import Path

import pytest
from _trainer_own_task import OwnTask, make_own_task, own_config
from sc_trainer import TaskRunner
from sc_trainer.config import TrainerConfigError
from sc_trainer.faults import RewardFault, RewardFaults
from sc_trainer.rewards import RewardFunctionError, RewardInput
from sc_trainer.runs import read_metrics
from sc_trainer.testing import final_weights, metric_differences

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> OwnTask:
    return make_own_task(tmp_path_factory.mktemp("own"))


def test_a_raising_reward_stops_the_run_and_a_resumed_run_loses_nothing(
    task: OwnTask, tmp_path: Path
) -> None:
    whole = TaskRunner(own_config(task, tmp_path / "whole", {"trainer.save_freq": 1})).run()
    faulty = {"trainer.save_freq": 1, "trainer.inject_fault": "reward:5@step=3:raise"}
    runner = TaskRunner(own_config(task, tmp_path / "split", faulty))
    with pytest.raises(RewardFunctionError, match=r"failed on row \d+ .*injected fault") as info:
        runner.run()
    assert f"{task.reward}:compute_score" in str(info.value)  # the user's function, named
    recorded = read_metrics(tmp_path / "split" / "metrics.jsonl")
    assert [r["step"] for r in recorded if "train/reward" in r] == [1, 2]
    resumed = TaskRunner(
        own_config(task, tmp_path / "split", {"trainer.resume_mode": "auto"})
    ).run()
    assert metric_differences(whole.history, resumed.history) == []
    theirs, mine = final_weights(whole.checkpoint), final_weights(resumed.checkpoint)
    assert theirs.keys() == mine.keys()
    assert all(theirs[k].equal(mine[k]) for k in theirs)


def test_a_hanging_reward_is_counted_in_its_step_when_the_run_counts_failures(
    task: OwnTask, tmp_path: Path
) -> None:
    settings = {
        "trainer.inject_fault": "reward:0@step=2:hang,reward:15@step=2:raise",
        "custom_reward_function.on_error": "count",
        "custom_reward_function.timeout_s": 0.5,
        "trainer.total_training_steps": 3,
    }
    result = TaskRunner(own_config(task, tmp_path / "run", settings)).run()
    failures = {r["step"]: r["reward/failures"] for r in result.history if "train/reward" in r}
    assert failures == {1: 0, 2: 2, 3: 0}


def test_a_hanging_reward_stops_the_run_naming_the_deadline(task: OwnTask, tmp_path: Path) -> None:
    settings = {
        "trainer.inject_fault": "reward:7@step=1:hang",
        "custom_reward_function.timeout_s": 0.5,
    }
    with pytest.raises(RewardFunctionError, match=r"row \d+ .*timed out after 0\.5 s"):
        TaskRunner(own_config(task, tmp_path / "run", settings)).run()


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("reward:16@step=1", r"position 16 is outside a step's 16 rows"),
        ("reward:1@step=1:explode", r"one of \('raise', 'hang'\), got 'explode'"),
        ("reward:1@step=0", r"step >= 1"),
        ("reward:x@step=1", r"must look like reward:POSITION@step=N"),
    ],
)
def test_bad_reward_faults_are_refused(
    task: OwnTask, tmp_path: Path, fault: str, expected: str
) -> None:
    with pytest.raises(TrainerConfigError, match=expected):
        own_config(task, tmp_path / "run", {"trainer.inject_fault": fault})


def test_a_reward_fault_needs_a_reward_function() -> None:
    from sc_trainer import TrainerConfig

    with pytest.raises(TrainerConfigError, match=r"reward fault needs a run that scores"):
        TrainerConfig(inject_fault="reward:0@step=1")


def test_reward_faults_fire_once_on_the_armed_step_only() -> None:
    calls: list[str] = []

    def score(data_source: str, solution_str: str, ground_truth: str) -> float:
        calls.append(solution_str)
        return 1.0

    faults = RewardFaults(RewardFault.parse_all("reward:1@step=2"), timeout_s=1.0)
    wrapped = faults.wrap(score)
    rows = [RewardInput("d", f"s{i}", "g", row=10 + i) for i in range(3)]

    def run(step: int) -> list[str]:
        faults.arm(step)
        outcome: list[str] = []
        for row in faults.apply(rows):
            try:
                wrapped(row.data_source, row.solution_str, row.ground_truth, row.extra_info)
                outcome.append("ok")
            except RuntimeError as error:
                outcome.append(str(error))
        return outcome

    assert run(1) == ["ok", "ok", "ok"]
    assert run(2) == ["ok", "injected fault: the reward function raised", "ok"]
    assert run(2) == ["ok", "ok", "ok"]  # once: a step run again does not fire it again
    assert calls == ["s0", "s1", "s2", "s0", "s2", "s0", "s1", "s2"]

    faults = RewardFaults(RewardFault.parse_all("reward:3@step=1"), timeout_s=1.0)
    faults.arm(1)
    with pytest.raises(TrainerConfigError, match=r"position 3 is outside the 3 rows of step 1"):
        faults.apply(rows)
