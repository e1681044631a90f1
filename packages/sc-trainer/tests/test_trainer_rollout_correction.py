"""The rollout correction in the trainer: its configuration (verl's
``algorithm.rollout_correction`` keys, checked), the driver stage that adds the weights and
the rejection mask to the actor's batch, and a short run that logs the mismatch metrics."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from _trainer_runs import run, tiny_config
from sc_protocol import DataProto
from sc_trainer import TrainerConfig, TrainerConfigError
from sc_trainer.config import RolloutCorrectionConfig, config_from_document, resolved_document
from sc_trainer.runs import read_metrics
from sc_trainer.trainer import apply_rollout_correction, rollout_mismatch

pytestmark = pytest.mark.timeout(300)

K = "algorithm.rollout_correction."


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({f"{K}rollout_is": "tokens"}, "algorithm.rollout_correction.rollout_is must be one of"),
        ({f"{K}rollout_rs": "geometric"}, "algorithm.rollout_correction.rollout_rs must be one of"),
        (
            {f"{K}rollout_is": "token", f"{K}rollout_is_threshold": 0},
            r"algorithm.rollout_correction.rollout_is_threshold must be a number > 0, got 0",
        ),
        (
            {f"{K}rollout_rs": "token", f"{K}rollout_rs_threshold": -2.0},
            "algorithm.rollout_correction.rollout_rs_threshold must be a number > 0, got -2.0",
        ),
        (
            {f"{K}rollout_rs": "sequence", f"{K}rollout_rs_threshold_lower": 0.0},
            "rollout_rs_threshold_lower must be a number > 0, got 0.0",
        ),
        (
            {
                f"{K}rollout_rs": "token",
                f"{K}rollout_rs_threshold": 1.5,
                f"{K}rollout_rs_threshold_lower": 1.5,
            },
            r"rollout_rs_threshold_lower \(1.5\) must be below rollout_rs_threshold \(1.5\)",
        ),
    ],
)
def test_bad_settings_are_config_errors_naming_the_key(
    document: dict[str, Any], message: str
) -> None:
    with pytest.raises(TrainerConfigError, match=message):
        config_from_document(document)


def test_the_keys_build_the_section_and_round_trip() -> None:
    assert not TrainerConfig().rollout_correction.enabled  # off by default
    config = config_from_document(
        {f"{K}rollout_is": "sequence", f"{K}rollout_is_threshold": 3, f"{K}rollout_rs": "token"}
    )
    corr = config.rollout_correction
    assert corr == RolloutCorrectionConfig(
        rollout_is="sequence", rollout_is_threshold=3.0, rollout_rs="token"
    )
    assert corr.bounds == pytest.approx((1 / 3, 3.0))
    document = resolved_document(config)
    assert document["algorithm"]["rollout_correction"]["rollout_is"] == "sequence"
    assert document["algorithm"]["adv_estimator"] == "gae"
    flat = {f"{K}{k}": v for k, v in document["algorithm"]["rollout_correction"].items()}
    assert config_from_document(flat).rollout_correction == corr


def _batch() -> DataProto:
    old = torch.tensor([[-1.0, -2.0, -0.5], [-0.3, -1.2, -4.0]])
    ratios = torch.tensor([[0.4, 1.5, 3.0], [1.2, 1.1, 1.0]])
    return DataProto.from_dict(
        tensors={
            "old_log_probs": old,
            "rollout_log_probs": old - ratios.log(),
            "response_mask": torch.tensor([[1, 1, 1], [1, 1, 0]]),
        }
    )


def test_the_stage_adds_weights_and_the_rejection_mask() -> None:
    metrics: dict[str, Any] = {}
    config = RolloutCorrectionConfig(
        rollout_is="token", rollout_rs="token", rollout_rs_threshold=2.5
    )
    batch = apply_rollout_correction(_batch(), config, metrics)
    assert batch.batch is not None
    weights = batch.batch["rollout_is_weights"]
    assert torch.allclose(weights, torch.tensor([[0.4, 1.5, 2.0], [1.2, 1.1, 0.0]]))
    # [1 / 2.5, 2.5]: 0.4 is on the lower bound (kept), 3.0 is above
    assert batch.batch["response_mask"].tolist() == [[1, 1, 0], [1, 1, 0]]
    assert metrics["rollout_corr/rollout_rs_masked_fraction"] == pytest.approx(1 / 5)
    rollout_mismatch(_batch(), metrics, config)
    assert metrics["rollout_corr/kl"] == pytest.approx(
        -sum(math.log(r) for r in (0.4, 1.5, 3.0, 1.2, 1.1)) / 5
    )


def test_with_the_correction_off_the_batch_is_untouched() -> None:
    batch = _batch()
    assert batch.batch is not None
    mask = batch.batch["response_mask"]
    metrics: dict[str, Any] = {}
    same = apply_rollout_correction(batch, RolloutCorrectionConfig(), metrics)
    assert same is batch
    assert same.batch is not None
    assert "rollout_is_weights" not in same.batch
    assert same.batch["response_mask"] is mask
    assert metrics == {}


def test_a_run_with_a_correction_logs_the_mismatch_metrics(tmp_path: Path) -> None:
    correction = RolloutCorrectionConfig(
        rollout_is="sequence", rollout_is_threshold=2.0, rollout_rs="token"
    )
    result = run(
        tiny_config(
            tmp_path, backend="local", algorithm="grpo", steps=2, rollout_correction=correction
        )
    )
    steps = [r for r in read_metrics(result.output.metrics_path) if r["step"] > 0]
    assert len(steps) == 2
    for record in steps:
        for key in (
            "rollout/log_prob_diff_max",
            "rollout_corr/kl",
            "rollout_corr/k3_kl",
            "rollout_corr/seq_log_ratio_max",
            "rollout_corr/token_out_of_bounds_fraction",
            "rollout_corr/rollout_is_mean",
            "rollout_corr/rollout_rs_masked_fraction",
        ):
            assert math.isfinite(record[key]), (key, record)
        # the sampler is the actor itself: the two policies agree to float precision
        assert record["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)
        assert record["rollout_corr/rollout_rs_masked_fraction"] == 0.0


def test_the_mismatch_is_reported_per_weight_version_span() -> None:
    """Rows a partial rollout resumed across a weight sync (``weight_version_max`` above
    ``_min``) get metrics of their own, ``rollout_corr/span<k>/*``."""
    batch = _batch()
    batch.non_tensor_batch["weight_version_min"] = np.array([3, 2])
    batch.non_tensor_batch["weight_version_max"] = np.array([3, 3])
    metrics: dict[str, Any] = {}
    rollout_mismatch(batch, metrics, RolloutCorrectionConfig())
    # row 0 (one version): ratios 0.4, 1.5, 3.0; row 1 (two): 1.2, 1.1 (its third is masked)
    assert metrics["rollout_corr/span0/log_prob_abs_diff_max"] == pytest.approx(math.log(3.0))
    assert metrics["rollout_corr/span1/log_prob_abs_diff_max"] == pytest.approx(math.log(1.2))
    assert metrics["rollout_corr/span0/rows_fraction"] == 0.5
    assert metrics["rollout_corr/span1/rows_fraction"] == 0.5
    k3 = [r - math.log(r) - 1 for r in (1.2, 1.1)]
    assert metrics["rollout_corr/span1/k3_kl"] == pytest.approx(sum(k3) / 2)
    plain: dict[str, Any] = {}
    rollout_mismatch(_batch(), plain, RolloutCorrectionConfig())
    assert not [k for k in plain if "/span" in k]  # worker-group batches have no versions
