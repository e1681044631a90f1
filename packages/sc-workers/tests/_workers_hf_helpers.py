"""Tiny Hugging Face models built in code, and the runs the HF tests compare.

Importing this module imports transformers (the test launcher's fork server preloads it,
so the ranks it starts do not import transformers each). Two architectures, both 2 layers
of width 64 with grouped-query attention (4 query heads, 2 key/value heads):

* ``qwen2`` — Qwen2 with tied input/output embeddings (the tensor-parallel engine keeps
  them replicated);
* ``llama`` — Llama with untied embeddings (split over the vocabulary under TP).

The tokenizer is a byte-level BPE trained here on a few sentences and wrapped in
``PreTrainedTokenizerFast``; each model directory is what a user's checkpoint looks like
(config, safetensors weights, tokenizer, generation config).
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from _workers_helpers import (
    BATCH,
    EOS_IDS,
    PROMPT_LEN,
    Strategy,
    actor_config,
    col,
    critic_config,
    dp_mini_batch_order,
    make_tensors,
    proto,
    rows,
    started_workers,
)
from sc_protocol import DataProto
from sc_workers import hf_worker_configs
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

transformers: Any = importlib.import_module("transformers")
tokenizers: Any = importlib.import_module("tokenizers")
# transformers imports a model's modules on first use: import them here, in the fork
# server's preload, rather than once in every rank
PRELOADED = (
    transformers.LlamaForCausalLM,
    transformers.LlamaForTokenClassification,
    transformers.Qwen2ForCausalLM,
    transformers.Qwen2ForTokenClassification,
    transformers.Qwen2Tokenizer,
    transformers.PreTrainedTokenizerFast,
)

VOCAB = 320  # the tokenizer's 300 ids, and room
GEN_LEN = 6
SEED = 3
ARCHS = ("qwen2", "llama")
CORPUS = [
    "the quick brown fox jumps over the lazy dog",
    "reverse the digits 12345 and then 67890",
    "hello world, a tiny model for tests",
]


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer (300 ids; pad 0, eos 1, bos 2) trained on CORPUS."""
    models, pre, dec, trainers = (
        tokenizers.models,
        tokenizers.pre_tokenizers,
        tokenizers.decoders,
        tokenizers.trainers,
    )
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre.ByteLevel(add_prefix_space=False)
    tok.decoder = dec.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<|pad|>", "<|eos|>", "<|bos|>"],
        initial_alphabet=pre.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", eos_token="<|eos|>", bos_token="<|bos|>"
    )


def _config(arch: str) -> Any:
    shape: dict[str, Any] = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 64,
        "pad_token_id": 0,
        "eos_token_id": 1,
        "bos_token_id": 2,
    }
    if arch == "qwen2":
        return transformers.Qwen2Config(tie_word_embeddings=True, **shape)
    return transformers.LlamaConfig(tie_word_embeddings=False, **shape)


def build_models(root: Path) -> dict[str, str]:
    """Save one directory per architecture under ``root``; returns ``{arch: path}``."""
    tokenizer = build_tokenizer()
    paths: dict[str, str] = {}
    for i, arch in enumerate(ARCHS):
        torch.manual_seed(100 + i)
        model = transformers.AutoModelForCausalLM.from_config(_config(arch))
        path = root / f"tiny-{arch}"
        model.save_pretrained(str(path))
        tokenizer.save_pretrained(str(path))
        paths[arch] = str(path)
    return paths


def plain_model(path: str | os.PathLike[str], value_head: bool = False) -> Any:
    """The model as transformers alone loads it (eval mode, float32)."""
    auto = (
        transformers.AutoModelForTokenClassification
        if value_head
        else (transformers.AutoModelForCausalLM)
    )
    return auto.from_pretrained(str(path), local_files_only=True).eval()


@torch.no_grad()
def plain_logits(model: Any, t: dict[str, torch.Tensor]) -> torch.Tensor:
    out: torch.Tensor = model(
        input_ids=t["input_ids"], attention_mask=t["attention_mask"], position_ids=t["position_ids"]
    ).logits
    return out


def plain_log_probs(model: Any, t: dict[str, torch.Tensor]) -> torch.Tensor:
    """Log-probabilities of the response tokens under the plain transformers forward."""
    length = t["responses"].shape[1]
    logits = plain_logits(model, t)[:, -length - 1 : -1].float()
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, t["responses"][..., None]).squeeze(-1)


@torch.no_grad()
def plain_greedy(
    model: Any,
    prompts: dict[str, torch.Tensor],
    steps: int,
    eos_ids: Sequence[int] = tuple(EOS_IDS),
) -> torch.Tensor:
    """Greedy responses recomputing the whole sequence each step (no key/value cache), with
    the workers' conventions: a response ends at an eos in ``eos_ids``, then pad id 0."""
    ids, mask, pos = prompts["input_ids"], prompts["attention_mask"], prompts["position_ids"]
    batch = ids.shape[0]
    responses = torch.zeros(batch, steps, dtype=ids.dtype)
    finished = torch.zeros(batch, dtype=torch.bool)
    eos = torch.tensor(list(eos_ids))
    for step in range(steps):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
        token = torch.where(finished, torch.zeros_like(ids[:, 0]), logits.argmax(-1))
        responses[:, step] = token
        alive = ~finished
        finished = finished | torch.isin(token, eos)
        ids = torch.cat([ids, token[:, None]], 1)
        mask = torch.cat([mask, alive.to(mask.dtype)[:, None]], 1)
        pos = torch.cat([pos, pos[:, -1:] + 1], 1)
    return responses


def prompts_of(t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    mask = t["attention_mask"][:, :PROMPT_LEN]
    return {
        "input_ids": t["prompts"],
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
    }


def _greedy_request(t: dict[str, torch.Tensor]) -> DataProto:
    return proto(prompts_of(t), do_sample=False, eos_token_id=EOS_IDS, response_length=GEN_LEN)


def run_roles(
    path: str,
    strategy: Strategy,
    tp: int,
    workdir: Path,
    update_order: torch.Tensor | None = None,
) -> dict[str, Any]:
    """Actor, reference, rollout and critic on the model at ``path``; one rank's results.

    Each dp rank takes its share of the batch; ``update_order`` reorders the rows given
    to the updates (so that one process sees the dp ranks' mini-batches). Afterwards the
    updated actor and critic are run on the whole batch, exported (``export_hf_model``)
    and checkpointed (``save_checkpoint``) under ``workdir``.
    """
    # AdamW's eps at 1e-2: a gradient far below it moves its weight like SGD rather than by
    # about lr, so rounding noise in a tiny gradient (which differs between the TP and the
    # single-process reduction orders) stays noise in the weights instead of a full step
    a_cfg, c_cfg = actor_config(strategy, tp), critic_config(strategy, tp)
    a_optim = dataclasses.replace(a_cfg.actor.optim, eps=1e-2)
    a_cfg = dataclasses.replace(a_cfg, actor=dataclasses.replace(a_cfg.actor, optim=a_optim))
    c_cfg = dataclasses.replace(c_cfg, optim=dataclasses.replace(c_cfg.optim, eps=1e-2))
    actor_cfg, critic_cfg = hf_worker_configs(path, a_cfg, c_cfg, seed=SEED)
    full = make_tensors()
    actor, critic, mine = started_workers(actor_cfg, critic_cfg, full)
    engine, critic_engine = actor.actor_engine, critic.critic_engine
    if engine is None or critic_engine is None:
        raise AssertionError("init_model built no engine")
    out: dict[str, Any] = {}
    hf_model: Any = engine.module.model
    out["fsdp_units"] = [isinstance(layer, FSDPModule) for layer in hf_model.model.layers] + [
        isinstance(engine.module, FSDPModule)
    ]
    q_proj = hf_model.model.layers[0].self_attn.q_proj.weight
    out["q_proj_local_rows"] = q_proj.to_local().shape[0] if isinstance(q_proj, DTensor) else None
    gen = actor.generate_sequences(_greedy_request(mine))
    out["gen_responses"] = col(gen, "responses")
    out["old_log_probs"] = col(
        actor.compute_log_prob(proto(mine, temperature=1.0)), "old_log_probs"
    )
    out["ref_log_prob"] = col(actor.compute_ref_log_prob(proto(mine)), "ref_log_prob")
    out["values"] = col(critic.compute_values(proto(mine)), "values")
    update = mine if update_order is None else rows(mine, update_order)
    out["actor_metrics"] = actor.update_actor(proto(update)).meta_info["metrics"]
    out["critic_metrics"] = critic.update_critic(proto(update)).meta_info["metrics"]
    with torch.no_grad():
        engine.eval_mode()
        critic_engine.eval_mode()
        args = (full["input_ids"], full["attention_mask"], full["position_ids"])
        out["logits"] = engine.forward(*args).cpu()
        out["values_after"] = critic_engine.forward(*args).cpu()
    actor.export_hf_model(str(workdir / "actor-hf"))
    critic.export_hf_model(str(workdir / "critic-hf"))
    actor.save_checkpoint(str(workdir / "actor-ckpt"))
    critic.save_checkpoint(str(workdir / "critic-ckpt"))
    return out


#: the two parallel runs: FSDP over 2 dp ranks, and tensor parallelism over 2 tp ranks
PARALLEL_RUNS: tuple[tuple[Strategy, int], ...] = (("fsdp", 1), ("megatron", 2))


def update_order() -> torch.Tensor:
    """Rows in the order that gives one dp group (tp=2, or one process) the mini-batches of
    2 dp ranks, each cutting its 4 rows into mini-batches of 2."""
    return dp_mini_batch_order(BATCH, dp=2, per_rank_mini=2)


def parallel_hf_job(paths: dict[str, str], rank: int, world: int, out: Path) -> None:
    """One rank of both parallel runs on every architecture (started by ``launch``): the
    dp=2 FSDP run, then the tp=2 run in the same process group."""
    import torch.distributed as dist

    results: dict[str, dict[str, Any]] = {}
    for strategy, tp in PARALLEL_RUNS:
        order = update_order() if tp > 1 else None  # dp=2 ranks hold their own mini-batches
        for arch, path in paths.items():
            results[f"{strategy}/{arch}"] = run_roles(
                path, strategy, tp, out / strategy / arch, order
            )
    torch.save(results, out / f"rank{rank}.pt")
    dist.barrier()
    dist.destroy_process_group()
