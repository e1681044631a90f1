"""dp=2 FSDP and tp=2 x dp=2 runs equal a single process on the same batch and seed.

Each run starts its own gloo processes. The single-process reference runs here, with
world size 1, on the batch reordered so that its mini-batches are the dp ranks' ones.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_helpers import (
    BATCH,
    actor_config,
    critic_config,
    dp_mini_batch_order,
    launch,
    make_tensors,
    parallel_job,
    run_pipeline,
)
from sc_workers import ActorRolloutRefWorker, CriticWorker

ATOL = 2e-5


@pytest.fixture(scope="module")
def reference() -> Iterator[dict[str, Any]]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        actor = ActorRolloutRefWorker(actor_config(), "actor_rollout_ref")
        critic = CriticWorker(critic_config())
        actor.init_model()
        critic.init_model()
        # dp=2 ranks each cut their 4 rows into mini-batches of 2
        order = dp_mini_batch_order(BATCH, dp=2, per_rank_mini=2)
        yield run_pipeline(actor, critic, make_tensors(), order)


def _check_against_reference(
    ref: dict[str, Any], outs: list[dict[str, Any]], collect: list[int]
) -> None:
    """Outputs of the collect ranks, concatenated in dp order, equal the reference."""
    for key in ("gen_responses", "gen_mask"):
        joined = torch.cat([outs[r][key] for r in collect])
        assert torch.equal(joined, ref[key]), key
    # some sequences stopped early, not all at the same step
    lengths = ref["gen_mask"].sum(-1)
    assert lengths.min() < 6
    assert len(set(lengths.tolist())) > 1
    for key in ("old_log_probs", "ref_log_prob", "new_log_probs", "values"):
        joined = torch.cat([outs[r][key] for r in collect])
        torch.testing.assert_close(joined, ref[key], atol=ATOL, rtol=1e-4, msg=key)
    # the update moved the weights, and moved them identically
    for which in ("actor_weights", "critic_weights"):
        for out in outs:
            assert set(out[which]) == set(ref[which])
            for name, tensor in ref[which].items():
                torch.testing.assert_close(
                    out[which][name], tensor, atol=ATOL, rtol=1e-4, msg=f"{which} {name}"
                )
    assert not torch.allclose(ref["new_log_probs"], ref["old_log_probs"])
    for which in ("actor_metrics", "critic_metrics"):
        for name, value in ref[which].items():
            for out in outs:
                assert out[which][name] == pytest.approx(value, rel=1e-4, abs=1e-5), (which, name)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_dp2_matches_single_process(reference: dict[str, Any], tmp_path: Path) -> None:
    launch(functools.partial(parallel_job, "fsdp", 1), world=2, out=tmp_path, timeout=240)
    outs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    _check_against_reference(reference, outs, collect=[0, 1])
    assert outs[0]["mesh"]["actor"] == (0, True)
    assert outs[1]["mesh"]["actor"] == (1, True)
    # HSDP (2 replicas of 1 shard) makes the same update
    for out in outs:
        for name, tensor in reference["actor_weights"].items():
            torch.testing.assert_close(
                out["hsdp_actor_weights"][name], tensor, atol=ATOL, rtol=1e-4, msg=name
            )
    # a checkpoint written by 2 ranks (one shard file each) resumes exactly
    for out in outs:
        assert out["resume_metrics_equal"]
        assert out["resume_weights_equal"]
    assert outs[0]["ckpt_root"] == ["CURRENT", "v000001"]
    assert outs[0]["ckpt_files"] == [
        "meta.json",
        "rank_00000_of_00002.pt",
        "rank_00001_of_00002.pt",
    ]


@pytest.mark.slow
@pytest.mark.extended  # TP is checked by default in test_workers_hf.py (dp2 and tp2)
@pytest.mark.timeout(300)
def test_tp2_dp2_matches_single_process(reference: dict[str, Any], tmp_path: Path) -> None:
    launch(functools.partial(parallel_job, "megatron", 2), world=4, out=tmp_path, timeout=270)
    outs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(4)]
    _check_against_reference(reference, outs, collect=[0, 2])
    # tp ranks of one dp group return identical outputs
    for key in ("old_log_probs", "values"):
        assert torch.equal(outs[0][key], outs[1][key])
        assert torch.equal(outs[2][key], outs[3][key])
    for mesh in ("actor", "rollout", "ref", "critic"):
        dp_ranks = [outs[r]["mesh"][mesh][0] for r in range(4)]
        collect = [outs[r]["mesh"][mesh][1] for r in range(4)]
        assert dp_ranks == [0, 0, 1, 1], mesh
        assert collect == [True, False, True, False], mesh
