"""Hugging Face decoders split into pipeline stages (extra ``sc-workers[hf]``).

In one process: the stages of Llama, Mistral, Qwen2 and Qwen3 decoders (sliding-window
layers included, SDPA and eager attention), run one after the other, equal the whole
model's forward, and keep its parameter names; the error paths. In gloo processes: an
actor and a critic loaded from a tiny Llama and Qwen2 directory (``model.path``) at PP=2 and
PP=2 x TP=2 give the single-rank run's log-probs, entropies and values, and its parameters
after one PPO (value) update, within 1e-5 in float32; their exports under PP reload with
transformers to the single-rank model's logits and values.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import importlib
import os
import weakref
from pathlib import Path
from typing import Any, cast

import pytest
import torch

if os.environ.get("SC_ISOLATED_PACKAGE") == "sc-workers":
    importlib.import_module("transformers")  # the nox session installs sc-workers[hf]
else:
    pytest.importorskip("transformers")

from _workers_helpers import launch, tiny_model
from _workers_hf_helpers import transformers
from _workers_pipeline_helpers import Layout
from _workers_pipeline_hf_helpers import (
    ARCHS,
    build_pipeline_models,
    hf_config,
    pipeline_hf_job,
    plain_outputs,
    reference_run,
)
from sc_workers import FSDPConfig, MegatronConfig, UnsupportedParallelismError
from sc_workers.engine import ParallelLayout, PipelineEngine, PipelineModel, block_modules
from sc_workers.models import HFCausalLM, HFStageSplit, HFValueModel, split_layers
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

ATOL = 1e-5


# ------------------------------------------------------------------------ one process
def _decoder_config(arch: str) -> Any:
    shape: dict[str, Any] = {
        "vocab_size": 40,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 3,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "tie_word_embeddings": False,
    }
    if arch == "qwen2":  # layer 0 full attention, layers 1 and 2 a window of 3 tokens
        window = {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 1}
        return transformers.Qwen2Config(**shape, **window)
    if arch == "mistral":  # every layer a window of 3 tokens
        return transformers.MistralConfig(**shape, sliding_window=3)
    cls = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config}[arch]
    return cls(**shape)


def _wrapped(arch: str, value_head: bool, attention: str) -> HFCausalLM | HFValueModel:
    torch.manual_seed(11)
    config = _decoder_config(arch)
    if value_head:
        backbone = transformers.AutoModel.from_config(config, attn_implementation=attention)
        return HFValueModel(backbone, nn.Linear(config.hidden_size, 1)).eval()
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attention)
    return HFCausalLM(model).eval()


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 40, (3, 9), generator=g)
    mask = torch.ones(3, 9, dtype=torch.long)
    mask[1, :2] = 0  # left padding
    mask[2, :4] = 0
    mask[0, -1] = 0  # right padding
    return ids, mask, (mask.cumsum(-1) - 1).clamp(min=0)


def _chain(split: HFStageSplit, num_stages: int, head: Any = None) -> torch.Tensor:
    ranges = split_layers(split.num_layers, num_stages)
    x: Any = _batch()
    for i, layers in enumerate(ranges):
        stage = split.stage(layers, i == 0, i == num_stages - 1)
        x = stage(*x, head=head) if stage.is_last else stage(*x)
    out: torch.Tensor = x
    return out


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("arch", ["llama", "mistral", "qwen2", "qwen3"])
@torch.no_grad()
def test_stages_in_turn_equal_the_whole_model(arch: str, attention: str) -> None:
    for value_head in (False, True):
        module = _wrapped(arch, value_head, attention)
        whole = module(*_batch())
        names = {name for name, _ in module.named_parameters()}
        for num_stages in (2, 3):
            split = HFStageSplit(module, block_modules(module), "test")
            stages = [
                split.stage(r, i == 0, i == num_stages - 1)
                for i, r in enumerate(split_layers(split.num_layers, num_stages))
            ]
            # every stage keeps its modules' names in the wrapped model
            for stage in stages:
                assert {n for n, _ in stage.named_parameters()} <= names
            merged = PipelineModel(stages)
            assert {n for n, _ in merged.named_parameters()} == names
            torch.testing.assert_close(_chain(split, num_stages), whole, atol=0, rtol=0)
            doubled = _chain(split, num_stages, head=lambda out: 2 * out)
            torch.testing.assert_close(doubled, 2 * whole, atol=0, rtol=0)
        prefix = "model.model." if not value_head else "model."
        first, last = stages[0], stages[-1]
        assert f"{prefix}embed_tokens.weight" in dict(first.named_parameters())
        assert f"{prefix}layers.0.mlp.up_proj.weight" in dict(first.named_parameters())
        head = "score.weight" if value_head else "model.lm_head.weight"
        assert {f"{prefix}norm.weight", head} <= set(dict(last.named_parameters()))
        assert head not in dict(first.named_parameters())
        if arch in ("mistral", "qwen2"):
            # the sliding window matters on this batch: full attention everywhere differs
            split = HFStageSplit(module, block_modules(module), "test")
            assert "sliding_attention" in split.layer_kinds
            split.layer_kinds = ["full_attention"] * split.num_layers
            assert not torch.allclose(_chain(split, 2), whole, atol=1e-3)


def test_a_stage_keeps_only_its_own_parts_alive() -> None:
    module = _wrapped("llama", False, "sdpa")
    layers = [weakref.ref(layer) for layer in block_modules(module)]
    head = weakref.ref(module.model.lm_head)
    split = HFStageSplit(module, block_modules(module), "test")
    stage = split.stage(range(0, 1), first=True, last=False)
    del module, split
    gc.collect()
    # the rest of the model is freed once the split is gone (a rank holds its stages only)
    assert [ref() is not None for ref in layers] == [True, False, False]
    assert head() is None
    assert stage.blocks() == [layers[0]()]
    assert stage.embed_tokens is not None
    assert stage.output_head is None


def _engine(path: str | None = None) -> PipelineEngine:
    model = dataclasses.replace(tiny_model(), path=path)
    layout = ParallelLayout.create(2, 1, pp_size=2)
    megatron = MegatronConfig(pipeline_model_parallel_size=2)
    return PipelineEngine(model, FSDPConfig(), layout, torch.device("cpu"), megatron=megatron)


def _parallelize(engine: PipelineEngine, module: nn.Module) -> None:
    # the checks come before any use of the mesh (or of a process group)
    engine._parallelize(module, cast(DeviceMesh, None))


def test_tied_embeddings_and_other_architectures_raise() -> None:
    torch.manual_seed(0)
    tied = transformers.Qwen2ForCausalLM(hf_config("qwen2", tied=True))
    with pytest.raises(
        UnsupportedParallelismError,
        match=r"rank 1: pipeline_model_parallel_size 2, model '/m/tied': Qwen2ForCausalLM "
        r"ties its input and output embeddings .*needs a checkpoint with untied embeddings",
    ):
        _parallelize(_engine("/m/tied"), HFCausalLM(tied))
    # a critic of the same checkpoint has no output embeddings to tie: it splits
    critic = HFValueModel(tied.model, nn.Linear(32, 1))
    assert HFStageSplit(critic, block_modules(critic), "critic").num_layers == 4
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=40)
    )
    with pytest.raises(
        UnsupportedParallelismError,
        match=r"rank 1: .*model '/m/gpt2': GPT2LMHeadModel \(model_type 'gpt2'\) cannot be "
        r"split into pipeline stages; splittable decoders: llama, mistral, qwen2, qwen3",
    ):
        _parallelize(_engine("/m/gpt2"), HFCausalLM(gpt2))
    with pytest.raises(UnsupportedParallelismError, match=r"Linear \(model None\) cannot be split"):
        _parallelize(_engine(), nn.Linear(2, 2))
    # layer types that are neither full nor sliding-window attention
    config = _decoder_config("qwen3")
    config.layer_types = ["full_attention", "chunked_attention", "full_attention"]
    odd = HFCausalLM(transformers.AutoModelForCausalLM.from_config(config))
    with pytest.raises(UnsupportedParallelismError, match=r"layer_types .*'chunked_attention'"):
        HFStageSplit(odd, block_modules(odd), "odd")
    # decoder layers that are not the decoder's `layers`
    llama = _wrapped("llama", False, "sdpa")
    with pytest.raises(UnsupportedParallelismError, match=r"not model\.model\.layers in order"):
        HFStageSplit(llama, block_modules(llama)[::-1], "reversed")


# ------------------------------------------------------------------- gloo processes
@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_pipeline_models(tmp_path_factory.mktemp("pp-hf"))


#: AdamW's eps of the runs without tensor parallelism: the pipelined run does the single
#: rank's arithmetic, so even an eps that turns rounding noise in a tiny gradient into a
#: whole step (lr) leaves the weights equal
EXACT_EPS = 1e-6
#: with tensor parallelism the reductions run in another order: an eps far above those
#: gradients moves their weights like SGD, so their rounding noise stays noise (as in
#: test_workers_hf; at 1e-6 the updated weights differ by about 3e-5, as they do at TP=2
#: without pipeline stages)
TP_EPS = 1e-2


@pytest.fixture(scope="module")
def references(models: dict[str, str]) -> dict[tuple[str, float], dict[str, Any]]:
    """The single-rank run (world size 1) of an architecture with an AdamW eps, computed
    when first asked for."""
    cache: dict[tuple[str, float], dict[str, Any]] = {}

    class _Lazy(dict[tuple[str, float], dict[str, Any]]):
        def __missing__(self, key: tuple[str, float]) -> dict[str, Any]:
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("WORLD_SIZE", "1")
                mp.setenv("RANK", "0")
                cache[key] = reference_run(models[key[0]], key[1])
            self[key] = cache[key]
            return cache[key]

    return _Lazy()


def _check(name: str, ref: dict[str, Any], outs: list[dict[str, Any]], workdir: Path) -> None:
    """One pipelined run (every rank's result) against the single-rank run."""
    collect = [o for o in outs if o["layout"][3]]
    assert len(collect) == 1, name  # dp 1: tp rank 0 of the last stage
    for key in ("old_log_probs", "entropys", "ref_log_prob", "new_log_probs", "values"):
        got = collect[0][key]
        torch.testing.assert_close(got, ref[key], atol=ATOL, rtol=0, msg=f"{name}: {key}")
    for which in ("actor_weights", "critic_weights"):
        merged: dict[str, torch.Tensor] = {}
        for out in outs:
            merged.update(out[which])
        assert sorted(merged) == sorted(ref[which]), (name, which)
        for key, value in ref[which].items():
            torch.testing.assert_close(merged[key], value, atol=ATOL, rtol=0, msg=f"{name}: {key}")
    metrics = collect[0]["actor_metrics"]
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm"):
        assert metrics[key] == pytest.approx(ref["actor_metrics"][key], abs=1e-5), (name, key)
    vf_loss = collect[0]["critic_metrics"]["critic/vf_loss"]
    assert vf_loss == pytest.approx(ref["critic_metrics"]["critic/vf_loss"], abs=1e-5), name
    # the first stage holds the embeddings and the first layers, not the head
    first = next(o for o in outs if o["layout"][0] == 0)["stage_names"]
    assert "model.model.embed_tokens.weight" in first
    assert "model.model.layers.0.self_attn.q_proj.weight" in first
    assert not any(n.startswith(("model.lm_head", "model.model.layers.2")) for n in first)
    # the exports (rank 0 wrote them) reload with transformers to the unsplit model's outputs
    logits = plain_outputs(workdir / "actor-hf", value_head=False)
    torch.testing.assert_close(logits, ref["logits"], atol=ATOL, rtol=0, msg=f"{name}: export")
    values = plain_outputs(workdir / "critic-hf", value_head=True)
    torch.testing.assert_close(values, ref["values_after"], atol=ATOL, rtol=0, msg=name)


def _launch(
    runs: list[tuple[str, str, Layout]], eps: float, tied: str | None, tmp_path: Path
) -> list[Any]:
    world = runs[0][2].world
    launch(functools.partial(pipeline_hf_job, runs, eps, tied), world, tmp_path, timeout=280)
    return [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(world)]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_pp2_actor_and_critic_match_one_rank(
    models: dict[str, str], references: dict[tuple[str, float], dict[str, Any]], tmp_path: Path
) -> None:
    # 1F1B on each architecture, and interleaved 1F1B (4 stages of one layer) on Llama
    runs = [(arch, models[arch], Layout(pp=2)) for arch in ARCHS]
    runs.append(("llama-vpp2", models["llama"], Layout(pp=2, vpp=2)))
    ranks = _launch(runs, EXACT_EPS, models["tied"], tmp_path)
    for name, _, layout in runs:
        ref = references[name.split("-")[0], EXACT_EPS]
        _check(f"{layout}/{name}", ref, [r[name] for r in ranks], tmp_path / name)
    for rank in ranks:
        assert rank["tied_error"].startswith("UnsupportedParallelismError: rank "), rank
        assert "ties its input and output embeddings" in rank["tied_error"]


@pytest.mark.slow
@pytest.mark.extended
@pytest.mark.timeout(300)
def test_pp2_tp2_actor_and_critic_match_one_rank(
    models: dict[str, str], references: dict[tuple[str, float], dict[str, Any]], tmp_path: Path
) -> None:
    ranks = _launch([("llama", models["llama"], Layout(pp=2, tp=2))], TP_EPS, None, tmp_path)
    ref = references["llama", TP_EPS]
    _check("pp2xtp2/llama", ref, [r["llama"] for r in ranks], tmp_path / "llama")
