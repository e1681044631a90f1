"""Tiny Hugging Face decoders split into pipeline stages: models, configs and per-rank jobs.

Two directories with untied embeddings and four decoder layers (two stages of two): a Llama
and a Qwen2 whose last two layers attend through a sliding window of 3 tokens (shorter than
the test sequences), both with grouped-query attention (4 query heads, 2 key/value heads:
tp 2 divides both). Each run is an actor (with its reference) and a critic loaded from the
directory (``model.path``).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import torch
from _workers_helpers import (
    Strategy,
    actor_config,
    critic_config,
    make_tensors,
    run_pipeline,
    started_workers,
)
from _workers_hf_helpers import VOCAB, build_tokenizer, transformers
from _workers_pipeline_helpers import Layout
from sc_workers import (
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    UnsupportedParallelismError,
    hf_worker_configs,
)
from sc_workers.engine import PipelineEngine

ARCHS = ("llama", "qwen2")
SEED = 5
LAYERS = 4


def hf_config(arch: str, tied: bool = False) -> Any:
    shape: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
        "tie_word_embeddings": tied,
    }
    if arch == "qwen2":
        window = {"use_sliding_window": True, "sliding_window": 3, "max_window_layers": 2}
        return transformers.Qwen2Config(**shape, **window)
    return transformers.LlamaConfig(**shape)


def build_pipeline_models(root: Path) -> dict[str, str]:
    """One directory per architecture in :data:`ARCHS`, and ``tied`` (a Qwen2 with tied
    embeddings); returns ``{name: path}``."""
    tokenizer = build_tokenizer()
    paths: dict[str, str] = {}
    for i, (name, arch, tied) in enumerate(
        [*((a, a, False) for a in ARCHS), ("tied", "qwen2", True)]
    ):
        torch.manual_seed(200 + i)
        model = transformers.AutoModelForCausalLM.from_config(hf_config(arch, tied))
        path = root / f"pp-{name}"
        model.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        paths[name] = str(path)
    return paths


def hf_configs(
    path: str, layout: Layout | None, eps: float
) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The actor and critic on the model at ``path`` with AdamW's ``eps``; ``None``: the
    single-rank reference (strategy fsdp, world size 1)."""
    strategy: Strategy = "fsdp" if layout is None else "megatron"
    a_cfg, c_cfg = actor_config(strategy), critic_config(strategy)
    a_optim = dataclasses.replace(a_cfg.actor.optim, eps=eps)
    a_cfg = dataclasses.replace(a_cfg, actor=dataclasses.replace(a_cfg.actor, optim=a_optim))
    c_cfg = dataclasses.replace(c_cfg, optim=dataclasses.replace(c_cfg.optim, eps=eps))
    actor, critic = hf_worker_configs(path, a_cfg, c_cfg, seed=SEED)
    if layout is None:
        return actor, critic
    meg = layout.megatron()
    actor = dataclasses.replace(
        actor,
        actor=dataclasses.replace(actor.actor, megatron=meg),
        ref=dataclasses.replace(actor.ref, megatron=meg),
    )
    return actor, dataclasses.replace(critic, megatron=meg)


def after_update(actor: Any, critic: Any) -> dict[str, torch.Tensor]:
    """The updated actor's logits and critic's values on the whole batch (one rank)."""
    full = make_tensors()
    args = (full["input_ids"], full["attention_mask"], full["position_ids"])
    with torch.no_grad():
        actor.actor_engine.eval_mode()
        critic.critic_engine.eval_mode()
        return {
            "logits": actor.actor_engine.forward(*args).cpu(),
            "values_after": critic.critic_engine.forward(*args).cpu(),
        }


def reference_run(path: str, eps: float) -> dict[str, Any]:
    """The single-rank run (the caller sets WORLD_SIZE=1, RANK=0)."""
    actor, critic, tensors = started_workers(*hf_configs(path, None, eps))
    out = run_pipeline(actor, critic, tensors, None, entropys=True)
    out.update(after_update(actor, critic))
    return out


def pipelined_run(path: str, layout: Layout, eps: float, workdir: Path) -> dict[str, Any]:
    """One rank's share of the pipelined run on ``path``, then the exports of the updated
    actor and critic to ``workdir`` (``export_hf_model``)."""
    actor, critic, mine = started_workers(*hf_configs(path, layout, eps))
    lay = actor.layout
    result = run_pipeline(actor, critic, mine, None, entropys=True)
    result["layout"] = (lay.pp_rank, lay.dp_rank, lay.tp_rank, lay.is_collect)
    engine = actor.actor_engine
    if not isinstance(engine, PipelineEngine):
        raise AssertionError(f"a pipelined layout built a {type(engine).__name__}")
    result["stage_names"] = sorted(n for n, _ in engine.stages[0].named_parameters())
    actor.export_hf_model(str(workdir / "actor-hf"))
    critic.export_hf_model(str(workdir / "critic-hf"))
    return result


def tied_error(path: str, layout: Layout) -> str:
    """The message with which building a pipelined actor on tied embeddings fails."""
    actor_cfg, _ = hf_configs(path, layout, 1e-6)
    actor = ActorRolloutRefWorker(actor_cfg, "actor")
    try:
        actor.init_model()
    except UnsupportedParallelismError as exc:
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def pipeline_hf_job(
    runs: list[tuple[str, str, Layout]],
    eps: float,
    tied: str | None,
    rank: int,
    world: int,
    out: Path,
) -> None:
    """One rank of the pipelined runs ``(name, path, layout)`` in one process group (started
    by ``launch``); with ``tied``, then the pipelined actor on that directory."""
    import torch.distributed as dist

    results: dict[str, Any] = {}
    for name, path, layout in runs:
        results[name] = pipelined_run(path, layout, eps, out / name)
    if tied is not None:
        results["tied_error"] = tied_error(tied, runs[0][2])
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()


def plain_outputs(path: Path, value_head: bool) -> torch.Tensor:
    """What transformers alone computes with the directory at ``path``: the causal LM's
    logits, or the token classifier's single output (values)."""
    auto = (
        transformers.AutoModelForTokenClassification
        if value_head
        else transformers.AutoModelForCausalLM
    )
    model = auto.from_pretrained(str(path), local_files_only=True).eval()
    t = make_tensors()
    with torch.no_grad():
        logits: torch.Tensor = model(
            input_ids=t["input_ids"],
            attention_mask=t["attention_mask"],
            position_ids=t["position_ids"],
        ).logits
    return logits[..., 0] if value_head else logits
