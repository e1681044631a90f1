"""``placement="separate"``: the rollout samples on a group of its own whose weights follow
the actor's by a weight sync after every update (``sc-demo --placement separate
--rollout-tp N``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from _trainer_runs import (
    assert_finite_training_metrics,
    assert_same_metrics,
    run,
    tiny_config,
    val_prompts,
)
from sc_core import SpanRecorder
from sc_trainer import TaskRunner, TrainerConfigError, make_launcher
from sc_trainer.cli import build_parser, config_from_args
from sc_trainer.runs import read_metrics

pytestmark = pytest.mark.timeout(300)


def _without_sync_keys(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [
        {k: v for k, v in r.items() if not k.startswith(("rollout/", "sync/", "timing/"))}
        for r in history
    ]


def test_separate_local_rollout_gives_the_colocated_numbers(tmp_path: Path) -> None:
    """World size 1 on the local backend: the separate rollout samples exactly what the actor
    would have (the in-memory sync makes its weights equal), so every metric matches."""
    separate = run(tiny_config(tmp_path / "sep", backend="local", placement="separate"))
    colocated = run(tiny_config(tmp_path / "col", backend="local"))
    history = read_metrics(separate.output.metrics_path)
    # the initial sync is version 1; each update is synced before the next step samples
    assert [r.get("rollout/weight_version") for r in history[1:]] == [1, 2, 3, 4]
    assert [r.get("sync/weight_version") for r in history[1:]] == [2, 3, 4, 5]
    assert_same_metrics(
        _without_sync_keys(history),
        _without_sync_keys(read_metrics(colocated.output.metrics_path)),
    )


@pytest.mark.extended
def test_separate_tp2_rollout_on_ray(ray_cluster: None, tmp_path: Path) -> None:
    """Actor FSDP dp=2 -> rollout TP=2 over gloo: training runs, every step samples with the
    weights of the update before it, and greedy generation equals the actor's own."""
    config = tiny_config(tmp_path, workers_per_role=2, placement="separate", rollout_tp=2)
    runner = TaskRunner(config)
    with make_launcher(config).running(), SpanRecorder() as recorder:
        trainer = runner.build_trainer(make_launcher(config))
        trainer.init_workers()
        try:
            result = trainer.fit()
            rollout = trainer.rollout_wg
            assert rollout is not None
            val = val_prompts(trainer, 8)
            mine = rollout.generate_sequences(val)
            theirs = trainer.actor_rollout_wg.generate_sequences(val)
        finally:
            trainer.close()
    assert mine.meta_info["weight_version"] == 5
    # the weights went from worker to worker: the driver fetched a few bytes of counts
    sync_spans = [s for s in recorder.spans if s.method.endswith(("sync_send", "sync_receive"))]
    assert len(sync_spans) == 2 * 5
    assert all(s.bytes_fetched < 1024 for s in sync_spans), [s.bytes_fetched for s in sync_spans]
    # the trace shows each sync as one span (one per step, and the first), around its calls
    syncs = [s for s in recorder.spans if s.method == "sync_weights"]
    assert len(syncs) == 5
    assert all([p.name for p in s.phases] == ["run"] and s.error is None for s in syncs)
    for call in sync_spans:
        assert sum(s.start <= call.start and (call.end or 0) <= (s.end or 0) for s in syncs) == 1
    assert mine.batch is not None
    assert theirs.batch is not None
    assert torch.equal(mine.batch["responses"], theirs.batch["responses"])
    history = read_metrics(result.output.metrics_path)
    assert_finite_training_metrics(history, critic=True)
    assert [r.get("rollout/weight_version") for r in history[1:]] == [1, 2, 3, 4]


def test_placement_config_errors(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match=r"placement must be one of"):
        tiny_config(tmp_path, placement="elsewhere")
    with pytest.raises(TrainerConfigError, match=r"rollout_tp=2 needs placement='separate'"):
        tiny_config(tmp_path, workers_per_role=2, rollout_tp=2)
    with pytest.raises(TrainerConfigError, match=r"rollout_tp \(2\) must divide .* 3 workers"):
        tiny_config(tmp_path, workers_per_role=3, placement="separate", rollout_tp=2)
    with pytest.raises(TrainerConfigError, match=r"rollout_tp must be >= 1, got 0"):
        tiny_config(tmp_path, placement="separate", rollout_tp=0)
    config = tiny_config(tmp_path, workers_per_role=2, placement="separate")
    assert config.worker_processes == 4  # the actor's pool and the rollout's


def test_cli_placement_flags() -> None:
    args = build_parser().parse_args(["--placement", "separate", "--rollout-tp", "2"])
    config = config_from_args(args)
    assert (config.placement, config.rollout_tp) == ("separate", 2)
