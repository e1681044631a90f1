"""A checkpoint loaded into a different parallel layout: each rank builds its blocks from the
saved blocks that overlap them.

Every checkpoint file records, per parameter, the full shape and where the rank's block
starts (``model_chunks``), and, from format 2 on, the names of its optimizer's parameters in
order (``optim_param_names``); a parameter's AdamW moments are blocks at the same place. For
each of its parameters a rank of the loading group

1. collects the blocks of that name from every saved rank that holds one (a pipeline stage's
   file holds only that stage's layers, under the unsplit model's names; replicas, such as
   tp-replicated norms or HSDP copies, hold identical blocks and one of them is read);
2. plans the pieces (:func:`plan_block`): the overlaps of the distinct saved blocks with its
   own block, which must cover it exactly;
3. copies them (:func:`fill_block`) out of the memory-mapped files, so only the bytes that
   overlap its block are read.

The moments go the same way and a parameter's ``step`` comes from any rank that holds it. The
result is the state the rank would have saved at its own layout (:func:`resharded_state`).
The lr schedule and the worker's counters (:data:`SHARED_EXTRA`) are the same on every rank
and come from saved rank 0; the RNG states and the other per-rank entries of ``extra`` (the
actor's sampler generator) come from the saved rank with the same dp rank
(:func:`rng_source`), or are left as they are when the checkpoint has fewer dp ranks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from .._errors import CheckpointError
from ..engine import Engine, ParallelLayout
from ..engine._state import chunk_of, local_tensor, optimizer_param_names
from ..sync._layout import Region

__all__ = [
    "SHARED_EXTRA",
    "Piece",
    "SavedRank",
    "assemble_full",
    "blocks_differ",
    "fill_block",
    "plan_block",
    "resharded_state",
    "rng_source",
]

#: the entries of a checkpoint's ``extra`` that are equal on every rank (the others, such as
#: the actor's sampler generator, belong to the rank's dp rank)
SHARED_EXTRA = ("update_steps", "global_step")
#: how many saved blocks an error message lists
_LISTED = 8


@dataclass(frozen=True)
class Piece:
    """One saved block's overlap with the block being built: ``region`` of the full tensor,
    read at ``source_index`` of source ``source`` and written at ``target_index``."""

    source: int
    region: Region
    source_index: tuple[slice, ...]
    target_index: tuple[slice, ...]


def _box(region: Region) -> str:
    dims = ", ".join(f"{o}:{o + n}" for o, n in zip(region.offset, region.shape, strict=True))
    return f"[{dims}]"


def _listing(sources: Sequence[tuple[str, Region]]) -> str:
    shown = [f"{label} {_box(block)}" for label, block in sources[:_LISTED]]
    if len(sources) > _LISTED:
        shown.append(f"and {len(sources) - _LISTED} more")
    return ", ".join(shown) if shown else "none"


def plan_block(
    where: str, name: str, target: Region, sources: Sequence[tuple[str, Region]]
) -> list[Piece]:
    """The pieces that build the block ``target`` of tensor ``name`` from saved blocks.

    ``sources`` are ``(label, block)`` pairs (the label, such as the file name, is for error
    messages). Empty blocks are skipped and identical blocks (replicas) are read once. Raises
    :class:`CheckpointError` naming ``name`` when two distinct blocks overlap inside
    ``target`` or the blocks leave part of it uncovered.
    """
    pieces: list[Piece] = []
    seen: set[Region] = set()
    for index, (label, block) in enumerate(sources):
        if block.numel == 0 or block in seen:
            continue
        seen.add(block)
        common = block.intersect(target)
        if common is None:
            continue
        for other in pieces:
            if other.region.intersect(common) is not None:
                first_label, first = sources[other.source]
                raise CheckpointError(
                    f"{where}: the saved blocks {_box(first)} ({first_label}) and "
                    f"{_box(block)} ({label}) of {name} overlap without being replicas"
                )
        pieces.append(Piece(index, common, common.within(block), common.within(target)))
    covered = sum(piece.region.numel for piece in pieces)
    if covered != target.numel:
        raise CheckpointError(
            f"{where}: the saved blocks of {name} cover {covered} of {target.numel} elements "
            f"of the block {_box(target)} being built (saved blocks: {_listing(sources)})"
        )
    return pieces


def fill_block(
    shape: Sequence[int], dtype: torch.dtype, pieces: Sequence[Piece], sources: Sequence[Tensor]
) -> Tensor:
    """A new tensor of ``shape`` filled with ``pieces`` (from :func:`plan_block`) of the
    tensors ``sources`` (one per source block, in the same order)."""
    out = torch.empty(tuple(shape), dtype=dtype)
    for piece in pieces:
        out[piece.target_index].copy_(sources[piece.source][piece.source_index])
    return out


def assemble_full(
    where: str, name: str, blocks: Sequence[tuple[str, Sequence[int], Sequence[int], Tensor]]
) -> Tensor:
    """A full tensor from ``(label, full_shape, offsets, local)`` blocks of every rank that
    holds one (an offline export)."""
    shape = tuple(int(s) for s in blocks[0][1])
    sources = [
        _block(where, label, name, full, at, local, shape) for label, full, at, local in blocks
    ]
    pieces = plan_block(where, name, Region.full(shape), sources)
    return fill_block(shape, blocks[0][3].dtype, pieces, [b[3] for b in blocks])


def _block(
    where: str,
    label: str,
    name: str,
    full: Sequence[int],
    offsets: Sequence[int],
    local: Tensor,
    expected: tuple[int, ...] | None,
) -> tuple[str, Region]:
    """A saved block as a region, checked: it lies inside its full shape, which is
    ``expected`` (when given)."""
    full_shape = tuple(int(s) for s in full)
    offset = tuple(int(o) for o in offsets)
    shape = tuple(local.shape)
    if expected is not None and full_shape != expected:
        raise CheckpointError(
            f"{where}: {label}: {name} has full shape {list(full_shape)}, expected {list(expected)}"
        )
    if math.prod(shape) == 0 and len(shape) == len(full_shape):
        return label, Region((0,) * len(shape), shape)  # an empty shard: nothing to place
    if not (
        len(offset) == len(shape) == len(full_shape)
        and all(o >= 0 and o + n <= f for o, n, f in zip(offset, shape, full_shape, strict=True))
    ):
        raise CheckpointError(
            f"{where}: {label}: the block of {name} (offsets {list(offset)}, shape "
            f"{list(shape)}) does not lie inside its full shape {list(full_shape)}"
        )
    return label, Region(offset, shape)


@dataclass(frozen=True)
class SavedRank:
    """One saved rank's file, loaded with ``mmap=True`` (tensors are read when touched)."""

    rank: int
    path: Path
    state: dict[str, Any]


def blocks_differ(state: Mapping[str, Any], module: nn.Module) -> bool:
    """Whether a file of the same world size and parallel sizes holds the same parameters
    with the same full shapes as ``module`` but other blocks (HSDP and FSDP sharding, say):
    then it loads by resharding. A file of another model does not count (the direct load
    names what differs)."""
    chunks = state.get("model_chunks")
    model = state.get("model")
    params = dict(module.named_parameters())
    if not isinstance(chunks, dict) or not isinstance(model, dict) or set(model) != set(params):
        return False
    differ = False
    for name, p in params.items():
        entry = chunks.get(name)
        if entry is None:
            return False
        full, offsets = chunk_of(p)
        if [int(s) for s in entry[0]] != full:
            return False
        local = tuple(local_tensor(p).shape)
        differ |= [int(o) for o in entry[1]] != offsets or tuple(model[name].shape) != local
    return differ


def rng_source(meta: Mapping[str, Any], layout: ParallelLayout, where: str) -> int | None:
    """The saved rank whose RNG states (and per-rank ``extra``) this rank takes: the one at
    the same dp rank, and at the same pipeline, sequence- and tensor-parallel ranks where
    the saved layout has them (else 0). ``None`` when the checkpoint has fewer dp ranks."""
    sizes = {key: int(meta.get(key, 1)) for key in ("dp_size", "tp_size", "pp_size", "sp_size")}
    world = int(meta["world_size"])
    if math.prod(sizes.values()) != world:
        raise CheckpointError(f"{where}: meta.json says world size {world} with sizes {sizes}")
    dp, tp, pp, sp = sizes["dp_size"], sizes["tp_size"], sizes["pp_size"], sizes["sp_size"]
    if layout.dp_rank >= dp:
        return None

    def same(rank: int, size: int) -> int:
        return rank if rank < size else 0

    stage = same(layout.pp_rank, pp)
    return ((stage * dp + layout.dp_rank) * sp + same(layout.sp_rank, sp)) * tp + same(
        layout.tp_rank, tp
    )


def _saved_blocks(
    saved: Sequence[SavedRank], params: Mapping[str, Tensor], where: str
) -> dict[str, list[tuple[int, Region]]]:
    """Per parameter name, the ``(index into saved, block)`` of every saved rank holding it."""
    found: dict[str, list[tuple[int, Region]]] = {}
    for index, entry in enumerate(saved):
        chunks = entry.state.get("model_chunks")
        model = entry.state.get("model")
        if not isinstance(chunks, dict) or not isinstance(model, dict):
            raise CheckpointError(f"{where}: {entry.path.name} has no block layout (model_chunks)")
        for name, tensor in model.items():
            if name not in chunks:
                raise CheckpointError(f"{where}: {entry.path.name} has no block for {name}")
            full, offsets = chunks[name]
            param = params.get(name)
            expected = None if param is None else tuple(param.shape)
            _, block = _block(where, entry.path.name, name, full, offsets, tensor, expected)
            found.setdefault(name, []).append((index, block))
    return found


def resharded_state(engine: Engine, saved: Sequence[SavedRank], where: str) -> dict[str, Any]:
    """This rank's state (as :meth:`Engine.local_state_dict` gives it) built from the files
    of another layout: ``saved`` holds every saved rank, in rank order."""
    module = engine.module
    params = dict(module.named_parameters())
    blocks = _saved_blocks(saved, params, where)
    missing = [name for name in params if name not in blocks]
    if missing:
        raise CheckpointError(
            f"{where}: no saved rank holds {missing[:_LISTED]} ({len(missing)} of this rank's "
            f"{len(params)} parameters); the checkpoint is of another model"
        )
    if engine.layout.pp_size == 1:  # this rank holds every parameter: nothing else may be saved
        unexpected = sorted(set(blocks) - set(params))
        if unexpected:
            raise CheckpointError(
                f"{where}: the checkpoint holds {unexpected[:_LISTED]}, which this model does "
                "not have; it is of another model"
            )
    targets: dict[str, Region] = {}
    model: dict[str, Tensor] = {}
    chunks: dict[str, tuple[list[int], list[int]]] = {}
    for name, p in params.items():
        local = local_tensor(p.detach())
        full, offsets = chunk_of(p)
        targets[name] = Region(tuple(offsets), tuple(local.shape))
        holders = blocks[name]
        labels = [(saved[i].path.name, block) for i, block in holders]
        pieces = plan_block(where, name, targets[name], labels)
        tensors = [saved[i].state["model"][name] for i, _ in holders]
        model[name] = fill_block(local.shape, local.dtype, pieces, tensors)
        chunks[name] = (full, offsets)
    state: dict[str, Any] = {"model": model, "model_chunks": chunks}
    optimizer, scheduler = engine.optimizer, engine.lr_scheduler
    if optimizer is not None and scheduler is not None:
        state["optim"] = _optimizer_state(module, optimizer, saved, blocks, targets, where)
        if "lr_scheduler" not in saved[0].state:
            raise CheckpointError(f"{where}: {saved[0].path.name} has no lr scheduler state")
        state["lr_scheduler"] = saved[0].state["lr_scheduler"]
    return state


def _named_optimizer_states(saved: Sequence[SavedRank], where: str) -> list[dict[str, Any]]:
    """Each saved rank's optimizer state entries, keyed by parameter name."""
    out: list[dict[str, Any]] = []
    for entry in saved:
        optim = entry.state.get("optim")
        names = entry.state.get("optim_param_names")
        if not isinstance(optim, dict):
            raise CheckpointError(f"{where}: {entry.path.name} has no optimizer state")
        if not isinstance(names, list):
            raise CheckpointError(
                f"{where}: {entry.path.name} does not name its optimizer's parameters "
                "(optim_param_names); it loads only into the layout that wrote it"
            )
        by_name: dict[str, Any] = {}
        for index, value in optim["state"].items():
            if not 0 <= int(index) < len(names):
                raise CheckpointError(
                    f"{where}: {entry.path.name}: optimizer state {index} has no parameter name "
                    f"({len(names)} named)"
                )
            by_name[names[int(index)]] = value
        out.append(by_name)
    return out


def _optimizer_state(
    module: nn.Module,
    optimizer: torch.optim.Optimizer,
    saved: Sequence[SavedRank],
    blocks: Mapping[str, list[tuple[int, Region]]],
    targets: Mapping[str, Region],
    where: str,
) -> dict[str, Any]:
    """This rank's optimizer state_dict (keyed by its own parameter order)."""
    named = _named_optimizer_states(saved, where)
    restored: dict[int, dict[str, Any]] = {}
    for index, name in enumerate(optimizer_param_names(module, optimizer)):
        holding = [i for i in range(len(saved)) if name in named[i]]
        holders = set(holding)
        if not holding:  # never stepped: no state anywhere
            continue
        entry: dict[str, Any] = {}
        for key, value in named[holding[0]][name].items():
            if key == "step" or not isinstance(value, Tensor):
                entry[key] = value.clone() if isinstance(value, Tensor) else value
                continue
            sources: list[tuple[str, Region]] = []
            tensors: list[Tensor] = []
            for i, block in blocks[name]:
                if i not in holders:
                    continue
                moment = named[i][name].get(key)
                if not isinstance(moment, Tensor) or tuple(moment.shape) != block.shape:
                    shape = list(moment.shape) if isinstance(moment, Tensor) else moment
                    raise CheckpointError(
                        f"{where}: {saved[i].path.name}: the optimizer's {key} of {name} is "
                        f"{shape}, not a block of its parameter's shape {list(block.shape)}"
                    )
                sources.append((saved[i].path.name, block))
                tensors.append(moment)
            target = targets[name]
            pieces = plan_block(where, f"{key} of {name}", target, sources)
            entry[key] = fill_block(target.shape, value.dtype, pieces, tensors)
        restored[index] = entry
    mine = optimizer.state_dict()["param_groups"]
    theirs = saved[0].state["optim"]["param_groups"]
    if len(mine) != len(theirs):
        raise CheckpointError(
            f"{where}: {saved[0].path.name} has {len(theirs)} optimizer parameter groups, this "
            f"optimizer {len(mine)}"
        )
    groups = [{**old, "params": new["params"]} for new, old in zip(mine, theirs, strict=True)]
    return {"state": restored, "param_groups": groups}
