"""Ulysses sequence parallelism in the FSDP engine equals a single process.

SP=2 (world 2) and SP=2 x DP=2 (world 4) runs of the built-in actor and critic, and SP=2
runs of a tiny Hugging Face Qwen2 (actor and critic) and of a Llama actor with one
key/value head (repeated before the all-to-all), in gloo processes, against the
single-rank run of the same model, batch and seed (float32): log-probabilities, values,
greedy generation, and the parameters after one PPO update. The batch's sequences are 9
tokens long, so every forward pads them to 10 for two sp ranks; a second batch of 8
tokens needs no padding. The error paths (heads not divisible by sp, an architecture
without transformers' attention interface, sliding windows, HSDP with sp) and the
dispatch (data to dp groups, outputs from sp rank 0) are checked in this process.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import logging
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
    per_rank,
    tiny_model,
)
from _workers_ulysses_helpers import (
    actor_only,
    hf_configs,
    pipeline,
    sp_actor_config,
    sp_critic_config,
    sp_job,
)
from sc_dispatch import make_nd_compute_dataproto_dispatch_fn
from sc_dispatch.ext import mesh_layout
from sc_dispatch.testing import FakeWorkerGroup
from sc_protocol import DataProto
from sc_workers import (
    ActorRolloutRefWorker,
    BatchError,
    ConfigError,
    CriticWorker,
    FSDPConfig,
    UnsupportedParallelismError,
    hf_model_config,
    hf_worker_configs,
)
from sc_workers.engine import ParallelLayout, make_engine
from sc_workers.engine._fsdp import prepare_sequence_parallel
from sc_workers.models import load_hf_model
from sc_workers.models._hf_ulysses import check_hf_sequence_parallel
from sc_workers.models._ulysses import SequenceParallel, causal_padding_mask, pad_to_multiple

logger = logging.getLogger(__name__)
ATOL = 1e-5  # float32, same weights: only the order of the reductions differs
HAS_HF = importlib.util.find_spec("transformers") is not None


def run_local(actor_cfg: Any, critic_cfg: Any, order: Any) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        actor = ActorRolloutRefWorker(actor_cfg, "actor_rollout_ref")
        critic = CriticWorker(critic_cfg)
        actor.init_model()
        critic.init_model()
        return pipeline(actor, critic, make_tensors(), order)


def actor_only_local(actor_cfg: Any) -> dict[str, Any]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        return actor_only(actor_cfg)


def _check(ref: dict[str, Any], outs: list[dict[str, Any]], collect: list[int]) -> float:
    """The collect ranks' outputs in dp order, and every rank's weights, equal the
    reference; returns the largest absolute difference seen."""
    worst = 0.0
    for key in ("gen_responses", "gen_mask"):
        assert torch.equal(torch.cat([outs[r][key] for r in collect]), ref[key]), key
    for key in ("old_log_probs", "even_log_probs", "ref_log_prob", "new_log_probs", "values"):
        joined = torch.cat([outs[r][key] for r in collect])
        torch.testing.assert_close(joined, ref[key], atol=ATOL, rtol=0, msg=key)
        worst = max(worst, float((joined - ref[key]).abs().max()))
    for which in ("actor_weights", "critic_weights"):
        for out in outs:
            assert set(out[which]) == set(ref[which])
            for name, tensor in ref[which].items():
                got = out[which][name]
                torch.testing.assert_close(got, tensor, atol=ATOL, rtol=0, msg=f"{which} {name}")
                worst = max(worst, float((got - tensor).abs().max()))
    # the update moved the weights (so equal weights mean equal updates)
    assert not torch.allclose(ref["new_log_probs"], ref["old_log_probs"], atol=1e-3)
    for which in ("actor_metrics", "critic_metrics"):
        for name, value in ref[which].items():
            for r in collect:
                assert outs[r][which][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    return worst


# ------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def hf_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str] | None:
    if not HAS_HF:
        return None
    from _workers_hf_helpers import VOCAB, build_models, build_tokenizer, transformers

    root = tmp_path_factory.mktemp("hf-models")
    paths = build_models(root)
    torch.manual_seed(0)
    config = transformers.BloomConfig(vocab_size=VOCAB, hidden_size=32, n_layer=1, n_head=4)
    bloom = transformers.AutoModelForCausalLM.from_config(config)
    bloom.save_pretrained(str(root / "tiny-bloom"))
    build_tokenizer().save_pretrained(str(root / "tiny-bloom"))
    paths["bloom"] = str(root / "tiny-bloom")
    torch.manual_seed(1)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    mqa = transformers.AutoModelForCausalLM.from_config(config)
    mqa.save_pretrained(str(root / "tiny-llama-mqa"))
    build_tokenizer().save_pretrained(str(root / "tiny-llama-mqa"))
    paths["llama_mqa"] = str(root / "tiny-llama-mqa")
    return paths


@pytest.fixture(scope="module")
def sp2_outs(
    hf_paths: dict[str, str] | None, tmp_path_factory: pytest.TempPathFactory
) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("sp2")
    launch(functools.partial(sp_job, hf_paths), world=2, out=out, timeout=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def dp_reference() -> dict[str, Any]:
    # 2 dp ranks each cut their 4 rows into mini-batches of 2
    order = dp_mini_batch_order(BATCH, dp=2, per_rank_mini=2)
    return run_local(actor_config(), critic_config(), order)


# --------------------------------------------------------------------------- tests
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_sp2_builtin_matches_single_process(sp2_outs: list[dict[str, Any]]) -> None:
    ref = run_local(actor_config(), critic_config(), None)
    outs = [o["builtin"] for o in sp2_outs]
    worst = _check(ref, outs, collect=[0])
    assert worst <= ATOL
    # the sp ranks of the one dp group return identical outputs
    for key in ("old_log_probs", "values", "new_log_probs"):
        assert torch.equal(outs[0][key], outs[1][key]), key
    assert [o["sp"] for o in outs] == [(0, 2), (1, 2)]
    assert [o["dp_group_size"] for o in outs] == [1, 1]
    assert [o["grad_average_ranks"] for o in outs] == [2, 2]
    assert outs[0]["param_mesh_sizes"] == {2}
    logger.info("sp2 built-in: max abs diff %.2e", worst)


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(300)
def test_sp2_dp2_builtin_matches_single_process(
    dp_reference: dict[str, Any], tmp_path: Path
) -> None:
    launch(functools.partial(sp_job, None), world=4, out=tmp_path, timeout=270)
    outs = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False)["builtin"] for r in range(4)]
    worst = _check(dp_reference, outs, collect=[0, 2])
    assert worst <= ATOL
    assert [o["sp"] for o in outs] == [(0, 2), (1, 2), (0, 2), (1, 2)]
    assert [o["dp_group_size"] for o in outs] == [2, 2, 2, 2]
    assert [o["grad_average_ranks"] for o in outs] == [4, 4, 4, 4]
    assert outs[0]["param_mesh_sizes"] == {4}
    for a, b in ((0, 1), (2, 3)):
        assert torch.equal(outs[a]["old_log_probs"], outs[b]["old_log_probs"])
    logger.info("sp2 x dp2 built-in: max abs diff %.2e", worst)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.skipif(not HAS_HF, reason="needs transformers (sc-workers[hf])")
def test_sp2_hf_matches_single_process(
    hf_paths: dict[str, str], sp2_outs: list[dict[str, Any]]
) -> None:
    ref = run_local(*hf_configs(hf_paths["qwen2"], 1), None)
    outs = [o["hf"] for o in sp2_outs]
    worst = _check(ref, outs, collect=[0])
    assert worst <= ATOL
    logger.info("sp2 HF qwen2: max abs diff %.2e", worst)
    # one key/value head (not divisible by sp): log-probs and the updated weights
    mqa_ref = actor_only_local(hf_configs(hf_paths["llama_mqa"], 1)[0])
    mqa = sp2_outs[0]["hf_mqa"]
    torch.testing.assert_close(mqa["old_log_probs"], mqa_ref["old_log_probs"], atol=ATOL, rtol=0)
    for out in sp2_outs:
        for name, tensor in mqa_ref["actor_weights"].items():
            got = out["hf_mqa"]["actor_weights"][name]
            torch.testing.assert_close(got, tensor, atol=ATOL, rtol=0, msg=name)
    mqa_worst = max(
        float((mqa["old_log_probs"] - mqa_ref["old_log_probs"]).abs().max()),
        *(
            float((out["hf_mqa"]["actor_weights"][n] - t).abs().max())
            for out in sp2_outs
            for n, t in mqa_ref["actor_weights"].items()
        ),
    )
    logger.info("sp2 HF llama, one key/value head: max abs diff %.2e", mqa_worst)
    assert mqa["actor_metrics"]["actor/grad_norm"] == pytest.approx(
        mqa_ref["actor_metrics"]["actor/grad_norm"], rel=1e-4
    )
    # an architecture whose attention bypasses transformers' registry is refused at load
    for out in sp2_outs:
        assert "BloomForCausalLM (bloom)" in out["bloom_error"]
        assert "ulysses_sequence_parallel_size 2" in out["bloom_error"]
        assert "rank " in out["bloom_error"]


# ------------------------------------------------------------------ in this process
def test_mesh_sends_data_to_dp_groups_and_collects_sp_rank_0(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    actors = per_rank(
        monkeypatch, 4, lambda: ActorRolloutRefWorker(sp_actor_config(2), "actor_rollout_ref")
    )
    critics = per_rank(monkeypatch, 4, lambda: CriticWorker(sp_critic_config(2)))
    assert [a.layout.sp_rank for a in actors] == [0, 1, 0, 1]
    assert [a.layout.dp_size for a in actors] == [2, 2, 2, 2]
    # mini-batches are per dp rank: 4 prompts over 2 dp groups (not 4 ranks)
    assert actors[0].actor_batch_sizes.mini_batch_size == 2
    assert critics[0].batch_sizes.mini_batch_size == 2
    for workers, meshes in ((actors, ("actor", "rollout", "ref")), (critics, ("critic",))):
        for mesh in meshes:
            tables = [w.get_dispatch_collect() for w in workers]
            answers = (
                [t["dispatch_dp_rank"][mesh] for t in tables],
                [t["collect_dp_rank"][mesh] for t in tables],
            )
            group = FakeWorkerGroup(4, {mesh: answers})
            assert mesh_layout(group, mesh) == ([0, 0, 1, 1], [True, False, True, False]), mesh
            mode = make_nd_compute_dataproto_dispatch_fn(mesh)
            batch = DataProto.from_dict(tensors={"x": torch.arange(8)[:, None]})
            args, _ = mode["dispatch_fn"](group, batch)
            shards = [a.batch["x"].flatten().tolist() for a in args[0]]
            assert shards == [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5, 6, 7], [4, 5, 6, 7]], mesh
            outputs = [DataProto.from_dict(tensors={"r": torch.tensor([[r]])}) for r in range(4)]
            collected = mode["collect_fn"](group, outputs)
            assert collected.batch["r"].flatten().tolist() == [0, 2], mesh


def test_heads_not_divisible_by_sp_is_a_config_error() -> None:
    model = dataclasses.replace(tiny_model(), num_attention_heads=4)
    with pytest.raises(
        ConfigError,
        match=r"actor_rollout_ref: model.num_attention_heads 4 is not divisible by "
        r"ulysses_sequence_parallel_size 3",
    ):
        dataclasses.replace(sp_actor_config(3), model=model)
    with pytest.raises(
        ConfigError,
        match=r"critic: model.num_attention_heads 4 is not divisible by "
        r"ulysses_sequence_parallel_size 3",
    ):
        sp_critic_config(3)
    sp_critic_config(4)  # 4 heads over 4 ranks is fine


def test_hsdp_with_sp_is_a_config_error() -> None:
    cfg = sp_actor_config(2, fsdp_size=1)
    layout = ParallelLayout.create(4, 1, sp_size=2)
    engine = make_engine(
        "fsdp", cfg.model, cfg.actor.fsdp_config, layout, torch.device("cpu"), cfg.actor.optim
    )
    # refused before joining any process group (this process has none of world size 4)
    with pytest.raises(
        ConfigError,
        match=r"FSDPEngine.build \(rank 1\): ulysses_sequence_parallel_size 2: "
        r"fsdp_config.fsdp_size 1 \(HSDP\) is not combined with sequence parallelism",
    ):
        engine.build()
    assert not engine.built
    # without sp the same fsdp_size is HSDP, checked the same way as before
    bad = FSDPConfig(param_dtype="float32", fsdp_size=3)
    plain = make_engine("fsdp", cfg.model, bad, ParallelLayout.create(4, 0), torch.device("cpu"))
    with pytest.raises(ConfigError, match="fsdp_size 3 does not divide the dp size 4"):
        plain.build()


def test_padding_and_sharding_helpers() -> None:
    t = make_tensors(2)
    ids, mask, pos = pad_to_multiple(t["input_ids"], t["attention_mask"], t["position_ids"], 4)
    assert ids.shape == mask.shape == pos.shape == (2, 12)
    assert torch.equal(ids[:, :9], t["input_ids"])
    assert not ids[:, 9:].any()
    assert not mask[:, 9:].any()
    assert not pos[:, 9:].any()
    same = pad_to_multiple(t["input_ids"], t["attention_mask"], t["position_ids"], 3)
    assert same[0] is t["input_ids"]  # 9 tokens divide by 3: nothing to pad
    full = causal_padding_mask(mask)
    assert full.shape == (2, 1, 12, 12)
    assert not full[..., 9:].any()  # nobody attends to the padding
    assert torch.equal(full[1, 0, 8, :9], mask[1, :9].bool())  # the last token: all real ones
    shard = SequenceParallel(group=None, rank=1, size=3)  # type: ignore[arg-type]
    assert torch.equal(shard.shard(ids), ids[:, 4:8])
    with pytest.raises(BatchError, match="length 8 along dim 1 is not divisible by the sp size 3"):
        shard.shard(t["input_ids"][:, :8], dim=1)


@pytest.mark.skipif(not HAS_HF, reason="needs transformers (sc-workers[hf])")
def test_hf_heads_not_divisible_and_unsupported_architectures(hf_paths: dict[str, str]) -> None:
    from _workers_hf_helpers import transformers  # imports transformers

    # at config time, from the directory's config.json (4 heads, sp 3)
    base = sp_actor_config(1)
    actor = dataclasses.replace(base.actor, ulysses_sequence_parallel_size=3)
    ref = dataclasses.replace(base.ref, ulysses_sequence_parallel_size=3)
    model = hf_model_config(hf_paths["qwen2"])  # a path: the config alone knows no heads
    cfg = dataclasses.replace(base, model=model, actor=actor, ref=ref)
    with pytest.raises(
        ConfigError,
        match=r"actor: model '.*tiny-qwen2': num_attention_heads 4 is not divisible by "
        r"ulysses_sequence_parallel_size 3",
    ):
        hf_worker_configs(hf_paths["qwen2"], cfg)
    # at load time: what the engine runs before sharding the model
    qwen = load_hf_model(hf_paths["qwen2"], False, torch.float32)
    with pytest.raises(
        ConfigError, match="here: num_attention_heads 4 is not divisible by ulysses_sequence"
    ):
        prepare_sequence_parallel(qwen, 3, "here")
    bloom = load_hf_model(hf_paths["bloom"], False, torch.float32)
    with pytest.raises(
        UnsupportedParallelismError, match=r"here: BloomForCausalLM \(bloom\) does not call"
    ):
        prepare_sequence_parallel(bloom, 2, "here")
    # sliding-window layers are refused too; full attention everywhere is fine
    qwen_sliding = transformers.Qwen2Config(
        num_attention_heads=4,
        num_key_value_heads=2,
        use_sliding_window=True,
        sliding_window=4,
        max_window_layers=0,
        num_hidden_layers=2,
    )
    with pytest.raises(
        UnsupportedParallelismError,
        match=r"here: the qwen2 model has \['sliding_attention'\] layers; "
        r"ulysses_sequence_parallel_size 2 covers full causal attention only",
    ):
        check_hf_sequence_parallel(qwen_sliding, 2, "here")
    mistral = transformers.MistralConfig(num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(UnsupportedParallelismError, match=r"sliding_attention \(window 4096\)"):
        check_hf_sequence_parallel(mistral, 2, "here")
    check_hf_sequence_parallel(transformers.MistralConfig(sliding_window=None), 2, "here")
    check_hf_sequence_parallel(transformers.Qwen2Config(num_attention_heads=4), 2, "here")
