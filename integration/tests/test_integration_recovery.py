"""Recovery in place (``TrainerConfig.inject_fault``, ``max_recoveries``): a rank killed when
a step begins is replaced, every role goes back to the newest checkpoint, and the run ends
with weights bit-identical to an uninterrupted run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _integration_runs import deterministic, run, tiny_config
from sc_core import SpanRecorder
from sc_integration import FaultSpec, TrainerConfigError, TrainerRecoveryError, read_metrics

pytestmark = pytest.mark.timeout(300)


def _weights(folder: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Every rank file's model tensors under a checkpoint folder."""
    out = {}
    for path in sorted(folder.rglob("*.pt")):
        state = torch.load(path, weights_only=False)
        model = state.get("model", state)
        out[str(path.relative_to(folder))] = {
            k: v for k, v in model.items() if isinstance(v, torch.Tensor)
        }
    return out


def _assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    assert wa
    assert all(wa.values())
    for name in wa:
        assert wa[name].keys() == wb[name].keys()
        for key, tensor in wa[name].items():
            assert torch.equal(tensor, wb[name][key]), (name, key)


def _steps(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in deterministic(r).items() if not k.startswith("recovery/")}
        for r in history
    ]


def _check_recovered(faulty: Any, clean: Any, failed_step: int, from_step: int) -> None:
    _assert_same_weights(faulty.checkpoint, clean.checkpoint)
    history = read_metrics(faulty.output.metrics_path)
    assert _steps(history) == _steps(read_metrics(clean.output.metrics_path))
    marked = [r for r in history if "recovery/count" in r]
    assert len(marked) == 1
    assert marked[0]["recovery/count"] == 1
    assert marked[0]["recovery/failed_step"] == failed_step
    assert marked[0]["recovery/from_step"] == from_step
    assert marked[0]["step"] == from_step + 1


def test_local_actor_death_recovers_bit_identically(tmp_path: Path) -> None:
    base: dict[str, Any] = {"backend": "local", "steps": 4, "save_every": 2, "val_every": 2}
    clean = run(tiny_config(tmp_path / "clean", **base))
    with SpanRecorder() as recorder:
        faulty = run(tiny_config(tmp_path / "faulty", inject_fault="actor:0@step=4", **base))
    _check_recovered(faulty, clean, failed_step=4, from_step=2)
    assert [s.method for s in recorder.spans].count("recovery") == 1


def test_ray_actor_rank_death_recovers_bit_identically(ray_cluster: None, tmp_path: Path) -> None:
    """FSDP dp=2, actor and critic colocated: rank 1 is killed as step 3 begins; the
    colocated process is replaced for both roles and the run replays step 3 from step 2."""
    base: dict[str, Any] = {"workers_per_role": 2, "steps": 3, "save_every": 2, "val_every": 3}
    clean = run(tiny_config(tmp_path / "clean", **base))
    faulty = run(tiny_config(tmp_path / "faulty", inject_fault="actor:1@step=3", **base))
    _check_recovered(faulty, clean, failed_step=3, from_step=2)


def test_a_death_before_the_first_checkpoint_starts_the_run_again(tmp_path: Path) -> None:
    """No checkpoint yet: every worker is replaced and the run restarts from step 0, ending
    as a run without the fault does."""
    base: dict[str, Any] = {"backend": "local", "steps": 3, "save_every": 3, "val_every": 3}
    clean = run(tiny_config(tmp_path / "clean", **base))
    faulty = run(tiny_config(tmp_path / "faulty", inject_fault="critic:0@step=2", **base))
    _check_recovered(faulty, clean, failed_step=2, from_step=0)


def test_recoveries_are_bounded(tmp_path: Path) -> None:
    config = tiny_config(
        tmp_path,
        backend="local",
        steps=3,
        save_every=1,
        max_recoveries=0,
        inject_fault="actor:0@step=2",
    )
    with pytest.raises(TrainerRecoveryError, match=r"recovered 0 times \(max_recoveries=0\)"):
        run(config)


def test_fault_spec_and_config_errors(tmp_path: Path) -> None:
    assert FaultSpec.parse("actor:1@step=30") == FaultSpec("actor", 1, 30)
    for bad in ("actor1@step=3", "actor:1@step=0", "reward:0@step=2", "actor:-1@step=2"):
        with pytest.raises(TrainerConfigError, match="inject_fault"):
            FaultSpec.parse(bad)
    with pytest.raises(TrainerConfigError, match="this run has no critic"):
        tiny_config(tmp_path, algorithm="grpo", inject_fault="critic:0@step=2")
    with pytest.raises(TrainerConfigError, match="placement='separate'"):
        tiny_config(tmp_path, inject_fault="rollout:0@step=2")
    with pytest.raises(TrainerConfigError, match="rank 2 is outside the 2 workers"):
        tiny_config(tmp_path, workers_per_role=2, inject_fault="actor:2@step=2")
    with pytest.raises(TrainerConfigError, match="max_recoveries must be >= 0, got -1"):
        tiny_config(tmp_path, max_recoveries=-1)
