"""Sharded, atomic checkpoints: one file per rank, published by a directory rename.

Layout of ``local_path``::

    meta.json                    format, world size, dp/tp sizes, global step (rank 0);
                                 for a Hugging Face model also "hf": its kind and source
    rank_00000_of_00004.pt       that rank's model shards (with where each block sits in
    ...                          the full tensor), optimizer state, lr schedule, RNG
                                 states and the worker's counters
    hf/                          a Hugging Face model's config, tokenizer and other
                                 non-weight files, copied from ``model.path``

:func:`export_hf_checkpoint` turns such a checkpoint into a ``save_pretrained`` directory
without a process group.

Every rank writes into ``<local_path>.tmp`` (each file through its own temporary name and
``os.replace``); after a barrier rank 0 swaps the directory into place, so a reader sees
either the previous complete checkpoint or the new complete one. All ranks must see the
same filesystem (one node, or a shared mount).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._errors import CheckpointError
from ..engine import Engine
from ..models._hf import HFModelKind, copy_hf_side_files, save_hf_model

__all__ = [
    "capture_rng",
    "export_hf_checkpoint",
    "load_engine_checkpoint",
    "restore_rng",
    "save_engine_checkpoint",
]

logger = logging.getLogger(__name__)

FORMAT = 1
#: the checkpoint's copy of a Hugging Face model's config and tokenizer
HF_DIR = "hf"


def _rank_file(rank: int, world: int) -> str:
    return f"rank_{rank:05d}_of_{world:05d}.pt"


def capture_rng(device: torch.device) -> dict[str, Any]:
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": np.random.get_state(),
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"], device)


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def save_engine_checkpoint(
    engine: Engine, local_path: str, global_step: int, extra: dict[str, Any]
) -> str:
    """Write this rank's shard; rank 0 publishes the directory. Returns the final path."""
    layout = engine.layout
    final = Path(local_path)
    tmp = final.with_name(final.name + ".tmp")
    if layout.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True, exist_ok=True)
    _barrier()
    tmp.mkdir(parents=True, exist_ok=True)
    state = engine.local_state_dict()
    state["rng"] = capture_rng(engine.device)
    state["extra"] = extra
    name = _rank_file(layout.rank, layout.world_size)
    partial = tmp / (name + ".partial")
    torch.save(state, partial)
    os.replace(partial, tmp / name)
    if layout.rank == 0:
        meta: dict[str, Any] = {
            "format": FORMAT,
            "world_size": layout.world_size,
            "dp_size": layout.dp_size,
            "tp_size": layout.tp_size,
            "strategy": engine.strategy,
            "global_step": global_step,
        }
        kind = engine.hf_kind
        source = engine.model_config.path
        if kind is not None and source is not None:
            meta["hf"] = {"kind": kind, "source": source}
            copy_hf_side_files(source, tmp / HF_DIR, include_config=True)
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    _barrier()
    if layout.rank == 0:
        expected = {_rank_file(r, layout.world_size) for r in range(layout.world_size)}
        present = {p.name for p in tmp.iterdir()}
        if not expected <= present:
            raise CheckpointError(
                f"save_checkpoint (rank 0): {tmp} lacks {sorted(expected - present)}; do all "
                "ranks share this filesystem?"
            )
        old = final.with_name(final.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
        logger.info("saved checkpoint at step %d to %s", global_step, final)
    _barrier()
    return str(final)


def _read_meta(root: Path, where: str) -> dict[str, Any]:
    meta_file = root / "meta.json"
    if not meta_file.is_file():
        raise CheckpointError(f"{where}: {meta_file} does not exist; not a complete checkpoint")
    meta: dict[str, Any] = json.loads(meta_file.read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{where}: {root} has format {meta.get('format')}, expected {FORMAT}")
    return meta


def load_engine_checkpoint(engine: Engine, local_path: str) -> dict[str, Any]:
    """Restore this rank's shard; returns the ``extra`` dict that was saved with it."""
    layout = engine.layout
    where = f"load_checkpoint (rank {layout.rank})"
    root = Path(local_path)
    meta = _read_meta(root, where)
    saved = (meta.get("world_size"), meta.get("dp_size"), meta.get("tp_size"))
    now = (layout.world_size, layout.dp_size, layout.tp_size)
    if saved != now:
        raise CheckpointError(
            f"{where}: {root} was written with world size {saved[0]} (dp {saved[1]}, tp "
            f"{saved[2]}), this group has world size {now[0]} (dp {now[1]}, tp {now[2]})"
        )
    shard = root / _rank_file(layout.rank, layout.world_size)
    if not shard.is_file():
        raise CheckpointError(f"{where}: {shard} does not exist")
    state = torch.load(shard, map_location="cpu", weights_only=False)
    engine.load_local_state_dict(state, str(shard))
    restore_rng(state["rng"], engine.device)
    extra: dict[str, Any] = state.get("extra", {})
    return extra


def _assemble(name: str, blocks: list[tuple[list[int], list[int], torch.Tensor]]) -> torch.Tensor:
    """One full tensor from the ranks' ``(global_shape, offsets, local)`` blocks."""
    shape = blocks[0][0]
    full = torch.empty(shape, dtype=blocks[0][2].dtype)
    seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
    covered = 0
    for global_shape, offsets, local in blocks:
        if global_shape != shape or len(offsets) != local.dim() or local.dim() != len(shape):
            raise CheckpointError(
                f"export: {name} has inconsistent shapes across ranks ({global_shape} vs {shape})"
            )
        key = (tuple(offsets), tuple(local.shape))
        if key in seen:  # a replica (tp-replicated or HSDP) of a block already placed
            continue
        seen.add(key)
        index = tuple(slice(o, o + n) for o, n in zip(offsets, local.shape, strict=True))
        full[index] = local
        covered += local.numel()
    if covered != full.numel():
        raise CheckpointError(
            f"export: the ranks' blocks of {name} cover {covered} of {full.numel()} elements"
        )
    return full


def export_hf_checkpoint(
    checkpoint_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str]
) -> str:
    """Write a Hugging Face directory (weights, config, tokenizer) from an sc checkpoint.

    ``checkpoint_dir`` is what ``save_checkpoint`` of an actor or critic wrote for a model
    loaded from ``model.path``; no process group is needed (one process reads every
    rank's file and reassembles full tensors from the FSDP/TP blocks). An actor's
    checkpoint becomes an ``AutoModelForCausalLM`` directory, a critic's an
    ``AutoModelForTokenClassification`` one with a single label. Returns ``out_dir``.
    Raises :class:`CheckpointError` for an incomplete checkpoint or one of the built-in model.
    """
    root = Path(checkpoint_dir)
    where = f"export_hf_checkpoint({str(root)!r})"
    meta = _read_meta(root, where)
    hf = meta.get("hf")
    if not isinstance(hf, dict) or hf.get("kind") not in ("causal_lm", "value_model"):
        raise CheckpointError(
            f"{where}: the checkpoint holds the built-in model, not a Hugging Face one "
            "(save it from a worker whose model.path is a Hugging Face directory)"
        )
    kind: HFModelKind = hf["kind"]
    world = int(meta["world_size"])
    shards: list[dict[str, Any]] = []
    for rank in range(world):
        path = root / _rank_file(rank, world)
        if not path.is_file():
            raise CheckpointError(f"{where}: {path} does not exist")
        state = torch.load(path, map_location="cpu", weights_only=False, mmap=True)
        if "model_chunks" not in state:
            raise CheckpointError(f"{where}: {path} has no block layout (model_chunks)")
        shards.append(state)
    full: dict[str, torch.Tensor] = {}
    for name in shards[0]["model"]:
        blocks = []
        for rank, state in enumerate(shards):
            if name not in state["model"]:
                raise CheckpointError(f"{where}: rank {rank} has no {name}")
            shape, offsets = state["model_chunks"][name]
            blocks.append((list(shape), list(offsets), state["model"][name]))
        full[name] = _assemble(name, blocks)
    save_hf_model(full, kind, root / HF_DIR, out_dir)
    return str(out_dir)
