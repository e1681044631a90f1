"""Pipeline parallelism equals the single-rank run of the same model and batch (float32).

PP=2 (1F1B and GPipe), interleaved 1F1B with two virtual stages per rank, PP=2 x TP=2,
PP=2 x DP=2 and PP=4 (whose middle stages are sent the batch's metadata only, as the
dispatch does): greedy generation (token for token), log-probs, entropies, values, and
the parameters after one PPO (and value) update match a world-size-1 run within 1e-5.
Each run starts its own gloo processes.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from _workers_helpers import (
    BATCH,
    dp_mini_batch_order,
    launch,
    make_tensors,
    run_pipeline,
    started_workers,
)
from _workers_pipeline_helpers import (
    Layout,
    configs,
    failure_job,
    pipeline_job,
    with_bans,
)

ATOL = 1e-5


def _reference(dp: int, banned: bool = False) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        tensors = with_bans(make_tensors()) if banned else make_tensors()
        actor, critic, tensors = started_workers(*configs(None), tensors)
        # the dp ranks each cut their rows into mini-batches of 4 / dp
        order = dp_mini_batch_order(BATCH, dp=dp, per_rank_mini=4 // dp) if dp > 1 else None
        return run_pipeline(actor, critic, tensors, order, entropys=True)


@pytest.fixture(scope="module")
def references() -> dict[tuple[int, bool], dict[str, Any]]:
    """The single-rank runs by (dp, whether the batch bans tokens), made when first asked."""
    cache: dict[tuple[int, bool], dict[str, Any]] = {}

    class _Lazy(dict[tuple[int, bool], dict[str, Any]]):
        def __missing__(self, key: tuple[int, bool]) -> dict[str, Any]:
            cache[key] = _reference(*key)
            self[key] = cache[key]
            return cache[key]

    return _Lazy()


def _run(layout: Layout, tmp_path: Path) -> list[dict[str, Any]]:
    launch(functools.partial(pipeline_job, layout), layout.world, tmp_path, timeout=240)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(layout.world)]


def _check(ref: dict[str, Any], outs: list[dict[str, Any]], layout: Layout) -> None:
    collect = [r for r, o in enumerate(outs) if o["layout"][3]]
    # the collect ranks: tp rank 0 of the last stage, one per dp rank, in dp order
    assert [outs[r]["layout"][:3] for r in collect] == [
        (layout.pp - 1, d, 0) for d in range(layout.dp)
    ]
    for key in ("gen_responses", "gen_mask"):
        joined = torch.cat([outs[r][key] for r in collect])
        assert torch.equal(joined, ref[key]), key
    assert len(set(ref["gen_mask"].sum(-1).tolist())) > 1  # rows stopped at different steps
    for key in ("old_log_probs", "entropys", "ref_log_prob", "new_log_probs", "values"):
        joined = torch.cat([outs[r][key] for r in collect])
        torch.testing.assert_close(joined, ref[key], atol=ATOL, rtol=0, msg=key)
    for which in ("actor_weights", "critic_weights"):
        merged: dict[str, torch.Tensor] = {}
        for out in outs:
            merged.update(out[which])
        assert sorted(merged) == sorted(ref[which]), which
        moved = 0.0
        for name, value in ref[which].items():
            torch.testing.assert_close(merged[name], value, atol=ATOL, rtol=0, msg=name)
        for name, value in merged.items():
            moved = max(moved, float((value - ref[which][name]).abs().max()))
    first = ref["actor_metrics"]
    mine = outs[collect[0]]["actor_metrics"]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert mine[key] == pytest.approx(first[key], abs=1e-5), key
    assert outs[collect[0]]["critic_metrics"]["critic/vf_loss"] == pytest.approx(
        ref["critic_metrics"]["critic/vf_loss"], abs=1e-5
    )
    # every rank is registered with its dp rank; the last stage's tp rank 0 collects; the
    # first and last stages read the batch, a middle stage only its metadata (sampling:
    # every stage)
    for out in outs:
        pp_rank, dp_rank, _, collects = out["layout"]
        reads = pp_rank in (0, layout.pp - 1)
        for name, registered in out["mesh"].items():
            assert registered == (dp_rank, collects, reads or name == "rollout"), name


@pytest.mark.parametrize(
    "layout",
    [
        pytest.param(Layout(pp=2), id="pp2-1f1b"),  # the representative the default run keeps
        pytest.param(Layout(pp=2, schedule="GPipe"), id="pp2-gpipe", marks=pytest.mark.extended),
        pytest.param(Layout(pp=2, vpp=2), id="pp2-interleaved", marks=pytest.mark.extended),
        pytest.param(Layout(pp=2, tp=2), id="pp2xtp2", marks=pytest.mark.extended),
        pytest.param(Layout(pp=2, dp=2), id="pp2xdp2", marks=pytest.mark.extended),
        pytest.param(Layout(pp=4), id="pp4", marks=pytest.mark.extended),
        # a banned_token_ids column: the last stage's head renormalises like the single rank
        pytest.param(Layout(pp=2, banned=True), id="pp2-banned", marks=pytest.mark.extended),
    ],
)
@pytest.mark.slow
def test_pipeline_matches_single_rank(
    layout: Layout, references: dict[tuple[int, bool], dict[str, Any]], tmp_path: Path
) -> None:
    ref = references[(layout.dp, layout.banned)]
    _check(ref, _run(layout, tmp_path), layout)
    if layout.banned:  # the column matters: the same run without it computes other log-probs
        plain = references[(layout.dp, False)]
        assert not torch.allclose(ref["old_log_probs"], plain["old_log_probs"], atol=1e-3)
        assert torch.equal(ref["gen_responses"], plain["gen_responses"])


@pytest.mark.slow
@pytest.mark.parametrize(
    "method", ["update_actor", pytest.param("compute_log_prob", marks=pytest.mark.extended)]
)
def test_a_stage_that_raises_inside_a_schedule_does_not_strand_its_peer(
    method: str, tmp_path: Path
) -> None:
    """The last stage fails inside the schedule and stays alive; the first stage, waiting
    for it (for a gradient, or to send the next activation), fails within seconds, not
    after the pipeline timeout (300 s here), and both name where the failure was."""
    launch(functools.partial(failure_job, method), 2, tmp_path, timeout=120)
    first, last = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    kind, message = last["outcome"]
    assert kind == "PipelineStageError"
    step = "train_step" if method == "update_actor" else "forward_only"
    assert f"rank 1 (pipeline stage 1 of 2): {step} failed" in message
    assert "index" in message.lower()  # the original error (an index out of range)
    kind, message = first["outcome"]
    assert kind == "PipelineStageError"
    assert "rank 0 (pipeline stage 0 of 2)" in message
    # the last stage stayed alive until the first one's call ended: the first one was
    # released by the teardown, not by the failed process exiting
    assert first["elapsed"] < 30, first
    # the peer's error names the stage that failed
    assert "aborted because rank 1 failed" in message
    for out in (first, last):
        # both ranks tore their process groups down; the next call rebuilds them (and the
        # pipeline engine, with the state it kept) and runs
        assert out["after"] == ("ok", ""), out["after"]
