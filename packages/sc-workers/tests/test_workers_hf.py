"""Hugging Face models (extra ``sc-workers[hf]``): tiny Qwen2 and Llama directories built in
code, loaded through the path a user's checkpoint takes.

The FSDP engine (dp=2) and the tensor-parallel engine (tp=2) run in gloo processes; their
log-probabilities equal the plain transformers forward, their updates equal one process,
greedy generation through the key/value cache equals transformers without a cache, and
their exports (from the workers, and offline from the sharded checkpoints) reload with
transformers to the same logits. The nox session installs the extra, so there these tests
must run, not skip.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

if os.environ.get("SC_ISOLATED_PACKAGE") == "sc-workers":
    importlib.import_module("transformers")  # the nox session installs sc-workers[hf]
else:
    pytest.importorskip("transformers")

from _workers_helpers import (
    BATCH,
    actor_config,
    col,
    critic_config,
    launch,
    make_tensors,
    proto,
)
from _workers_hf_helpers import (
    GEN_LEN,
    SEED,
    build_models,
    build_tokenizer,
    plain_greedy,
    plain_log_probs,
    plain_logits,
    plain_model,
    prompts_of,
    run_roles,
    transformers,
    update_order,
)
from sc_workers import (
    ActorRolloutRefWorker,
    BatchError,
    CheckpointError,
    ConfigError,
    CriticWorker,
    OptionalDependencyError,
    UnsupportedParallelismError,
    export_hf_checkpoint,
    hf_model_config,
    hf_worker_configs,
    load_hf_tokenizer,
)
from sc_workers.engine import init_distributed, parallelize_hf_model
from sc_workers.models import (
    HFCausalLM,
    check_hf_tensor_parallel,
    load_hf_model,
    save_hf_model,
)
from sc_workers.workers._sampling import BatchSampling, generate

ATOL = 1e-5  # float32, same weights: only the reduction order differs
UPDATE_ATOL = 5e-5  # after two AdamW steps


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return build_models(tmp_path_factory.mktemp("hf"))


@pytest.fixture(autouse=True)
def _single_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")


# ----------------------------------------------------------------- loading and configs
def test_model_config_and_tokenizer_from_the_directory(models: dict[str, str]) -> None:
    for arch, path in models.items():
        cfg = hf_model_config(path, seed=4)
        assert cfg.path == path
        assert (cfg.vocab_size, cfg.hidden_size, cfg.num_hidden_layers) == (320, 64, 2)
        assert (cfg.num_attention_heads, cfg.intermediate_size) == (4, 128)
        assert (cfg.pad_token_id, cfg.eos_token_id, cfg.seed) == (0, 1, 4)
        assert cfg.tie_word_embeddings == (arch == "qwen2")
        tokenizer = load_hf_tokenizer(path)
        text = "reverse the digits 12345"
        ids = tokenizer(text).input_ids
        assert ids
        assert max(ids) < cfg.vocab_size
        assert tokenizer.decode(ids) == text


def test_token_ids_from_generation_config_and_overrides(
    models: dict[str, str], tmp_path: Path
) -> None:
    path = tmp_path / "several-eos"
    plain_model(models["llama"]).save_pretrained(str(path))
    tokenizer = build_tokenizer()
    tokenizer.pad_token = None  # a tokenizer without a pad token pads with eos
    tokenizer.save_pretrained(str(path))
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [5, 1]}))
    assert load_hf_tokenizer(str(path)).pad_token_id == 1
    cfg = hf_model_config(str(path))
    assert (cfg.eos_token_id, cfg.pad_token_id) == ((5, 1), 1)
    cfg = hf_model_config(str(path), eos_token_id=7, pad_token_id=3, dtype="bfloat16")
    assert (cfg.eos_token_id, cfg.pad_token_id, cfg.dtype) == (7, 3, "bfloat16")


def test_worker_configs_check_the_tensor_parallel_size(models: dict[str, str]) -> None:
    actor, critic = hf_worker_configs(models["llama"], seed=2)
    assert actor.model.path == critic.model.path == models["llama"]
    assert actor.model.seed == critic.model.seed == 2
    # 4 query heads and 2 key/value heads: tp 2 divides both, 4 only the query heads
    hf_worker_configs(models["llama"], critic=critic_config("megatron", 2))
    with pytest.raises(ConfigError, match=r"num_key_value_heads 2 is not divisible by .* 4"):
        hf_worker_configs(models["llama"], actor_config("megatron", 4))
    with pytest.raises(
        ConfigError, match=r"critic: .*num_attention_heads 4 is not divisible by .* 3"
    ):
        hf_worker_configs(models["qwen2"], critic=critic_config("megatron", 3))


def test_not_a_model_directory_and_no_transformers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    missing = str(tmp_path / "missing")
    with pytest.raises(ConfigError, match="is not a local Hugging Face model directory"):
        load_hf_model(missing, value_head=False, dtype=torch.float32)
    with pytest.raises(ConfigError, match=r"no config\.json"):
        hf_model_config(missing)
    with pytest.raises(ConfigError, match=r"no config\.json"):
        load_hf_tokenizer(missing)

    def no_transformers(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    monkeypatch.setattr("sc_workers.models._hf.importlib.import_module", no_transformers)
    with pytest.raises(OptionalDependencyError, match=r"install sc-workers\[hf\]"):
        load_hf_model(missing, value_head=False, dtype=torch.float32)


def test_no_eos_token_anywhere(models: dict[str, str], tmp_path: Path) -> None:
    path = tmp_path / "no-eos"
    config = plain_model(models["llama"]).config
    config.eos_token_id = None
    config.save_pretrained(str(path))  # a config alone: no tokenizer, no generation config
    with pytest.raises(ConfigError, match="names an eos token; pass eos_token_id"):
        hf_model_config(str(path))
    cfg = hf_model_config(str(path), eos_token_id=(4, 5))
    assert (cfg.eos_token_id, cfg.pad_token_id) == ((4, 5), 0)  # pad from the config


def _tiny_gpt2(n_inner: int | None = 64) -> Any:
    return transformers.GPT2Config(n_embd=32, n_layer=1, n_head=2, n_inner=n_inner, vocab_size=40)


def test_tensor_parallel_needs_llama_style_layers() -> None:
    init_distributed(1, 0, torch.device("cpu"))
    from torch.distributed.device_mesh import init_device_mesh

    module = HFCausalLM(transformers.GPT2LMHeadModel(_tiny_gpt2()))
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("tp",))
    with pytest.raises(UnsupportedParallelismError, match=r"GPT2Block has no linear layers"):
        parallelize_hf_model(module, mesh, "gpt2")
    # no decoder layers at all
    bare = torch.nn.Linear(2, 2)
    bare.config = _tiny_gpt2()
    with pytest.raises(UnsupportedParallelismError, match="found no decoder layers in Linear"):
        parallelize_hf_model(HFCausalLM(bare), mesh, "bare")
    with pytest.raises(ConfigError, match=r"no integer intermediate_size \(got None\)"):
        check_hf_tensor_parallel(_tiny_gpt2(n_inner=None), 2, "gpt2")
    check_hf_tensor_parallel(_tiny_gpt2(n_inner=None), 1, "gpt2")  # nothing to split


def test_adapter_inputs_are_checked(models: dict[str, str]) -> None:
    module = load_hf_model(models["llama"], value_head=False, dtype=torch.float32)
    assert isinstance(module, HFCausalLM)
    ids = torch.ones(2, 3, dtype=torch.long)
    with pytest.raises(BatchError, match="takes an HFCache"):
        module(ids, torch.ones_like(ids), torch.zeros_like(ids), object())
    cache = module.new_cache()
    module(ids, torch.ones_like(ids), torch.arange(3).expand(2, 3), cache)
    assert cache.length == 3
    with pytest.raises(BatchError, match=r"does not match batch 2 x \(cached 3 \+ new 1\)"):
        module(ids[:, :1], torch.ones_like(ids), torch.full((2, 1), 3), cache)
    critic = load_hf_model(models["llama"], value_head=True, dtype=torch.float32)
    with pytest.raises(ConfigError, match="does not take a key/value cache"):
        critic(ids, torch.ones_like(ids), torch.zeros_like(ids), cache)


def test_a_one_label_classifier_needs_a_score_layer(tmp_path: Path) -> None:
    config = _tiny_gpt2()
    config.num_labels = 1
    transformers.GPT2ForTokenClassification(config).save_pretrained(str(tmp_path / "gpt2-tc"))
    with pytest.raises(ConfigError, match="has no one-output 'score' layer"):
        load_hf_model(str(tmp_path / "gpt2-tc"), value_head=True, dtype=torch.float32)


# ------------------------------------------------------------ one process, world size 1
def test_greedy_generation_through_the_cache_equals_transformers(models: dict[str, str]) -> None:
    t = make_tensors(BATCH)
    prompts = prompts_of(t)
    for arch, path in models.items():
        actor_cfg, _ = hf_worker_configs(path, actor_config(), seed=SEED)
        worker = ActorRolloutRefWorker(actor_cfg, "rollout")
        worker.init_model()
        engine = worker.actor_engine
        assert engine is not None
        assert engine.supports_kv_cache
        params = BatchSampling(GEN_LEN, 1.0, -1, 1.0, False, (1,), 0)
        runs = []
        for use_cache in (True, False):
            responses, _, _ = generate(
                engine,
                prompts["input_ids"],
                prompts["attention_mask"],
                prompts["position_ids"],
                params,
                torch.Generator(),
                use_cache=use_cache,
            )
            runs.append(responses)
        assert torch.equal(runs[0], runs[1]), arch
        # and through the worker, with several eos ids, against transformers without a cache
        out = worker.generate_sequences(
            proto(
                prompts,
                do_sample=False,
                eos_token_id=list(range(3, 320, 4)),
                response_length=GEN_LEN,
            )
        )
        expected = plain_greedy(plain_model(path), prompts, GEN_LEN, range(3, 320, 4))
        assert torch.equal(col(out, "responses"), expected), arch


def test_a_critic_reloads_its_exported_head(models: dict[str, str], tmp_path: Path) -> None:
    t = make_tensors(4)
    _, critic_cfg = hf_worker_configs(models["qwen2"], critic=critic_config(), seed=SEED)
    critic = CriticWorker(critic_cfg)
    critic.init_model()
    values = col(critic.compute_values(proto(t)), "values")
    critic.export_hf_model(str(tmp_path / "critic"))
    config = json.loads((tmp_path / "critic" / "config.json").read_text())
    assert config["architectures"] == ["Qwen2ForTokenClassification"]
    again = CriticWorker(
        dataclasses.replace(critic_cfg, model=hf_model_config(str(tmp_path / "critic")))
    )
    again.init_model()
    torch.testing.assert_close(col(again.compute_values(proto(t)), "values"), values)
    # another seed initialises a new head differently: the head above came from the export
    other = CriticWorker(
        dataclasses.replace(critic_cfg, model=hf_model_config(models["qwen2"], seed=9))
    )
    other.init_model()
    assert not torch.allclose(col(other.compute_values(proto(t)), "values"), values)


def test_export_error_paths(models: dict[str, str], tmp_path: Path) -> None:
    actor_cfg, _ = hf_worker_configs(models["qwen2"], actor_config(), seed=SEED)
    actor = ActorRolloutRefWorker(actor_cfg, "actor")
    actor.init_model()
    ckpt = tmp_path / "ckpt"
    actor.save_checkpoint(str(ckpt))
    ckpt = ckpt / "v000001"  # the published version
    assert sorted(p.name for p in (ckpt / "hf").iterdir()) == [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert json.loads((ckpt / "meta.json").read_text())["hf"]["kind"] == "causal_lm"
    shard = ckpt / "rank_00000_of_00001.pt"
    state = torch.load(shard, weights_only=True)
    # a block that does not cover its tensor
    broken = dict(state, model_chunks=dict(state["model_chunks"]))
    name = "model.model.norm.weight"
    broken["model_chunks"][name] = ([128], [0])
    torch.save(broken, shard)
    with pytest.raises(
        CheckpointError, match=re.escape(f"blocks of {name} cover 64 of 128 elements")
    ):
        export_hf_checkpoint(ckpt, tmp_path / "out")
    # a checkpoint written before blocks were recorded
    torch.save({k: v for k, v in state.items() if k != "model_chunks"}, shard)
    with pytest.raises(CheckpointError, match=r"has no block layout \(model_chunks\)"):
        export_hf_checkpoint(ckpt, tmp_path / "out")
    shard.unlink()
    with pytest.raises(CheckpointError, match=r"rank_00000_of_00001\.pt does not exist"):
        export_hf_checkpoint(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # the writer: names the model does not have, tensors it lacks
    full = actor.actor_engine.full_state_dict() if actor.actor_engine else {}
    with pytest.raises(CheckpointError, match=r"has no parameters \['extra.weight'\]"):
        save_hf_model(
            {**full, "model.extra.weight": torch.zeros(1)},
            "causal_lm",
            ckpt / "hf",
            tmp_path / "out",
        )
    partial = {k: v for k, v in full.items() if "layers.1." not in k}
    with pytest.raises(CheckpointError, match=r"the state dict lacks \['model.layers.1"):
        save_hf_model(partial, "causal_lm", ckpt / "hf", tmp_path / "out")
    # a failed write on rank 0 raises there (and, with several ranks, on every rank)
    (tmp_path / "file").write_text("")
    with pytest.raises(OSError):  # noqa: PT011 - whatever the filesystem says
        actor.export_hf_model(str(tmp_path / "file" / "out"))


def test_the_built_in_model_has_no_hf_export(tmp_path: Path) -> None:
    actor = ActorRolloutRefWorker(actor_config(), "actor")
    actor.init_model()
    with pytest.raises(ConfigError, match="the built-in model has no Hugging Face format"):
        actor.export_hf_model(str(tmp_path / "out"))
    actor.save_checkpoint(str(tmp_path / "ckpt"))
    with pytest.raises(CheckpointError, match="holds the built-in model"):
        export_hf_checkpoint(tmp_path / "ckpt", tmp_path / "out")
    with pytest.raises(CheckpointError, match="no complete checkpoint there"):
        export_hf_checkpoint(tmp_path / "nothing", tmp_path / "out")


# -------------------------------------------------------------- dp=2 and tp=2, gloo
@pytest.fixture(scope="module")
def references(
    models: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, dict[str, Any]]]:
    """One process (world size 1) per architecture, updating on the rows in the order
    that gives it the parallel runs' mini-batches."""
    root = tmp_path_factory.mktemp("hf-reference")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WORLD_SIZE", "1")
        mp.setenv("RANK", "0")
        yield {
            arch: run_roles(path, "fsdp", 1, root / arch, update_order())
            for arch, path in models.items()
        }


def _check_parallel_run(
    arch: str,
    path: str,
    ref: dict[str, Any],
    got: list[dict[str, Any]],
    collect: list[int],
    workdir: Path,
) -> None:
    full = make_tensors()
    plain = plain_model(path)

    def joined(key: str) -> torch.Tensor:
        return torch.cat([got[r][key] for r in collect])

    # FSDP2 wraps every decoder layer, then the root
    assert got[0]["fsdp_units"] == [True, True, True]
    # the actor's log-probs equal transformers' own forward on the same weights
    expected = plain_log_probs(plain, full)
    torch.testing.assert_close(joined("old_log_probs"), expected, atol=ATOL, rtol=ATOL)
    torch.testing.assert_close(joined("ref_log_prob"), expected, atol=ATOL, rtol=ATOL)
    # greedy decoding through the cache equals transformers recomputing every step
    assert torch.equal(joined("gen_responses"), plain_greedy(plain, prompts_of(full), GEN_LEN))
    torch.testing.assert_close(joined("values"), ref["values"], atol=ATOL, rtol=ATOL)
    # one update (two mini-batches) equals one process
    for which in ("actor_metrics", "critic_metrics"):
        for name, value in ref[which].items():
            assert got[0][which][name] == pytest.approx(value, rel=1e-4, abs=1e-5), name
    for key in ("logits", "values_after"):
        torch.testing.assert_close(got[0][key], ref[key], atol=UPDATE_ATOL, rtol=1e-4)
    assert not torch.allclose(got[0]["logits"], plain_logits(plain, full), atol=1e-3)
    # the worker's export, and the offline export of the sharded checkpoint, reload with
    # transformers to the engine's logits / values
    export_hf_checkpoint(workdir / "actor-ckpt", workdir / "actor-offline")
    export_hf_checkpoint(workdir / "critic-ckpt", workdir / "critic-offline")
    for name in ("actor-hf", "actor-offline"):
        logits = plain_logits(plain_model(workdir / name), full)
        torch.testing.assert_close(logits, got[0]["logits"], atol=ATOL, rtol=ATOL)
    for name in ("critic-hf", "critic-offline"):
        values = plain_logits(plain_model(workdir / name, value_head=True), full)[..., 0]
        torch.testing.assert_close(values, got[0]["values_after"], atol=ATOL, rtol=ATOL)
    tokenizer = load_hf_tokenizer(str(workdir / "actor-offline"))
    assert tokenizer("hello world").input_ids == load_hf_tokenizer(path)("hello world").input_ids


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_fsdp_dp2_and_tp2_match_transformers(
    models: dict[str, str], references: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    from _workers_hf_helpers import parallel_hf_job

    launch(functools.partial(parallel_hf_job, models), 2, tmp_path, timeout=270)
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(2)]
    for arch, path in models.items():
        fsdp = [r[f"fsdp/{arch}"] for r in ranks]
        tp = [r[f"megatron/{arch}"] for r in ranks]
        # dp=2: each rank returns its half of the batch
        _check_parallel_run(arch, path, references[arch], fsdp, [0, 1], tmp_path / "fsdp" / arch)
        # tp=2 x dp=1: one dp group; rank 0 returns the outputs, rank 1 computes the same
        _check_parallel_run(arch, path, references[arch], tp, [0], tmp_path / "megatron" / arch)
        for key in ("old_log_probs", "gen_responses", "values"):
            assert torch.equal(tp[0][key], tp[1][key]), (arch, key)
        # q_proj (4 heads x 16) holds 32 rows per rank: sharded over dp, split over tp
        assert fsdp[0]["q_proj_local_rows"] == tp[0]["q_proj_local_rows"] == 32
    assert references["llama"]["q_proj_local_rows"] == 64  # one process holds all 4 heads
