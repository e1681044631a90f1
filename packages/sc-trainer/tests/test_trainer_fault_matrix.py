"""The fault-injection matrix of recovery in place, on Ray (gloo, CPU).

Short PPO runs (FSDP dp=2, 4 steps, a checkpoint every 2, written in the background, one
hot-standby process per worker group) in which one rank is killed: of the actor group or of
the critic group (each on its own processes), or of the colocated actor+critic group (one
process for both roles), at a point drawn with a seeded random generator:

* ``start``: as a step begins (the driver kills the process);
* ``call``: some milliseconds into a worker method (generation, log-probs, values);
* ``collective``: some milliseconds into an update, whose FSDP all-gathers and
  reduce-scatters the peer rank is waiting in when its partner dies;
* ``checkpoint``: some milliseconds into ``save_checkpoint``, while the state is copied or
  written in the background.

The pipelined cases put the actor on two pipeline stages (PP=2) and kill a rank inside an
update's 1F1B schedule, inside a log-prob pass, or as a step begins.

Every run must finish within its deadline and end with weights bit-identical to the run
without a fault (which equals a resume from any of its checkpoints, as the resume tests
show). The draws are fixed (seeded), so a failure names a case that replays.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from _trainer_runs import final_weights

pytestmark = [pytest.mark.timeout(240)]

#: the methods a "call" fault may hit, per role, and the updates a "collective" one hits
CALLS = {"actor": ("generate_sequences", "compute_log_prob"), "critic": ("compute_values",)}
UPDATES = {"actor": "update_actor", "critic": "update_critic"}
POINTS = ("start", "call", "collective", "checkpoint")
RUNS = 20
STEPS, SAVE_EVERY = 4, 2


@dataclass(frozen=True)
class Case:
    colocate: bool
    fault: str

    def __str__(self) -> str:
        return f"{'colocated' if self.colocate else 'separate'}-{self.fault}"


def _draw(index: int) -> Case:
    """Case ``index`` of the matrix: every (placement, role, point) combination comes round
    in turn; the rank, the step and the delay are drawn."""
    rng = random.Random(1000 + index)
    colocate = index % 2 == 0
    role = ("actor", "critic")[(index // 2) % 2]
    point = POINTS[(index // 4) % len(POINTS)]
    rank = rng.randrange(2)
    step = rng.randrange(1, STEPS + 1)
    delay = round(rng.uniform(0.0, 0.05), 3)
    if point == "start":
        fault = f"{role}:{rank}@step={step}"
    elif point == "call":
        fault = f"{role}:{rank}@step={step}:{rng.choice(CALLS[role])}+{delay}"
    elif point == "collective":
        fault = f"{role}:{rank}@step={step}:{UPDATES[role]}+{delay}"
    else:  # the checkpoint written after step 2 (a death after the last call goes unseen)
        fault = f"{role}:{rank}@step=2:save_checkpoint+{delay}"
    return Case(colocate, fault)


CASES = [_draw(i) for i in range(RUNS)]
#: the cases the default integration session runs (CI time): a death inside a collective and
#: one during a checkpoint write, colocated; the in-process tests cover a death as a step
#: begins and inside a call, and the faults nox session runs the whole matrix
DEFAULT = {10, 14}


def _config(tmp: Path, colocate: bool, **extra: Any) -> Any:
    from _trainer_runs import tiny_config

    return tiny_config(
        tmp,
        workers_per_role=2,
        steps=STEPS,
        save_every=SAVE_EVERY,
        val_every=STEPS,
        colocate=colocate,
        **extra,
    )


class CleanRuns:
    """The run without a fault, per placement (``runs[colocate]``), each made when first
    asked for: the default run's cases are all colocated, so it makes that one only."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._factory = tmp_path_factory
        self._runs: dict[bool, Any] = {}

    def __getitem__(self, colocate: bool) -> Any:
        from _trainer_runs import run

        if colocate not in self._runs:
            folder = self._factory.mktemp(f"clean{colocate}")
            self._runs[colocate] = run(_config(folder, colocate))
        return self._runs[colocate]


@pytest.fixture(scope="module")
def clean_runs(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> CleanRuns:
    return CleanRuns(tmp_path_factory)


@pytest.mark.extended
def test_separate_pools_give_the_same_numbers_as_colocated(clean_runs: CleanRuns) -> None:
    """Placement does not change the numbers: the critic on its own processes trains as the
    critic sharing the actor's."""
    from _trainer_runs import assert_same_metrics
    from sc_trainer.runs import read_metrics

    colocated, separate = clean_runs[True], clean_runs[False]
    assert_same_metrics(
        read_metrics(separate.output.metrics_path), read_metrics(colocated.output.metrics_path)
    )


def test_the_matrix_covers_every_placement_role_and_point() -> None:
    assert len(CASES) >= 20
    assert {_point_of(CASES[i].fault) for i in DEFAULT} == {"collective", "checkpoint"}
    seen = {(c.colocate, c.fault.split(":")[0], _point_of(c.fault)) for c in CASES}
    assert seen == {
        (colocate, role, point)
        for colocate in (True, False)
        for role in ("actor", "critic")
        for point in POINTS
    }


def _point_of(fault: str) -> str:
    if ":" not in fault.split("@", 1)[1]:
        return "start"
    method = fault.split(":")[2].split("+")[0]
    if method == "save_checkpoint":
        return "checkpoint"
    return "collective" if method.startswith("update_") else "call"


@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=() if i in DEFAULT else pytest.mark.fault_matrix)
        for i, c in enumerate(CASES)
    ],
    ids=str,
)
def test_a_killed_rank_is_recovered_bit_identically(
    case: Case, clean_runs: CleanRuns, tmp_path: Path
) -> None:
    from _trainer_runs import run

    result = run(_config(tmp_path, case.colocate, inject_fault=case.fault, standby=1))
    # the fault fired and was recovered from (a fault armed for a method that did not run
    # again before the end would not have fired: the draws avoid that)
    _recovered_once_bit_identically(result, clean_runs[case.colocate], case)


#: pipelined cases: the actor on two pipeline stages (PP=2, dp=1) loses a rank inside the
#: 1F1B schedule of an update, or inside a log-prob pass (a forward-only schedule), or as a
#: step begins; its peer stage, waiting in a send or receive, fails at once (gloo's
#: connection closes), and the group recovers in place like an FSDP one
PIPELINED = [
    "actor:1@step=3:update_actor+0.02",
    "actor:0@step=2:compute_log_prob+0.01",
    "actor:1@step=4",
]


@pytest.fixture(scope="module")
def clean_pipelined_run(ray_cluster: None, tmp_path_factory: pytest.TempPathFactory) -> Any:
    from _trainer_runs import run

    return run(_config(tmp_path_factory.mktemp("clean-pp"), True, actor_pp=2))


@pytest.mark.parametrize(
    "fault",
    # the faults session runs them (a pipeline stage's recovery in place); by default,
    # sc-workers' pipeline tests check that a stage raising in its schedule releases its peer
    [pytest.param(f, marks=pytest.mark.fault_matrix) for f in PIPELINED],
)
def test_a_killed_pipeline_stage_is_recovered_bit_identically(
    fault: str, clean_pipelined_run: Any, tmp_path: Path
) -> None:
    from _trainer_runs import run

    result = run(_config(tmp_path, True, actor_pp=2, inject_fault=fault, standby=1))
    _recovered_once_bit_identically(result, clean_pipelined_run, fault)


def _recovered_once_bit_identically(result: Any, clean: Any, what: object) -> None:
    """``result``'s final weights are ``clean``'s bit for bit, it logged every step, and it
    recovered once (``what``, the case, in the messages)."""
    from sc_trainer.runs import read_metrics

    got = final_weights(result.checkpoint)
    expected = final_weights(clean.checkpoint)
    assert got.keys() == expected.keys()
    for key, tensor in expected.items():
        assert torch.equal(got[key], tensor), (what, key)
    history = read_metrics(result.output.metrics_path)
    assert [r["step"] for r in history] == list(range(STEPS + 1))
    assert sum("recovery/count" in r for r in history) == 1, what
