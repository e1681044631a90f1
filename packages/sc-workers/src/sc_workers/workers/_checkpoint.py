"""Sharded, atomic checkpoints: one file per rank, published through a pointer file.

Layout of ``local_path``::

    CURRENT                      the name of the published version ("v000003"), replaced
                                 atomically
    v000003/                     one complete checkpoint:
        meta.json                format, world size, dp/tp/pp/sp sizes, strategy, global
                                 step (rank 0); for a Hugging Face model also "hf": its kind
                                 and source
        rank_00000_of_00004.pt   that rank's file: "model" (its blocks of the parameters it
        ...                      holds), "model_chunks" (per parameter the full shape and
                                 where the block starts), "optim" (the torch.optim
                                 state_dict of those blocks, keyed by parameter index) and
                                 "optim_param_names" (the names in that order),
                                 "lr_scheduler", "rng" (the RNG states) and "extra" (the
                                 worker's counters)
        hf/                      a Hugging Face model's config, tokenizer and other
                                 non-weight files, copied from ``model.path``
    v000004.tmp/                 a save in progress (or one that died)

A save writes every rank's file into the next ``vNNNNNN.tmp/`` (each file through its own
temporary name and ``os.replace``); after a barrier rank 0 checks that every file is there,
renames the directory to ``vNNNNNN/`` (atomic), replaces ``CURRENT`` (atomic), and only then
removes older versions and leftovers of dead saves. At every instant ``CURRENT`` names a
complete version, or, if the process dies between the rename and the pointer update, the
previous one, which still exists; a reader that finds no usable ``CURRENT`` takes the newest
complete version. A checkpoint written by sc-workers 0.1 (the files directly in
``local_path``) is still read. All ranks must see the same filesystem (one node, or a
shared mount).

A checkpoint loads into any layout: the same one reads only the rank's own file; another
world size, dp/tp/pp/sp split, strategy (fsdp and megatron name parameters alike) or HSDP
sharding is resharded (:mod:`._reshard`): every rank memory-maps the files and copies the
parts of the saved blocks that overlap its own. Files of format 1 (sc-workers 0.2, without
"optim_param_names") load only into the layout that wrote them.

Loading uses ``torch.load(weights_only=True)``: a checkpoint holds tensors and plain values
only, and a crafted file cannot run code. :func:`export_hf_checkpoint` turns a checkpoint into
a ``save_pretrained`` directory without a process group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.serialization
from sc_core import worker_environ

from .._errors import CheckpointError
from .._settings import PG_TIMEOUT
from ..engine import Engine
from ..models._hf import HFModelKind, copy_hf_side_files, save_hf_model
from ._checkpoint_background import BackgroundSave, wait_for_files
from ._reshard import (
    SHARED_EXTRA,
    SavedRank,
    assemble_full,
    blocks_differ,
    resharded_state,
    rng_source,
)
from ._rng import capture_rng, restore_rng

__all__ = [
    "published_checkpoint",
    "published_step",
    "capture_rng",
    "export_hf_checkpoint",
    "load_engine_checkpoint",
    "restore_rng",
    "save_engine_checkpoint",
]

logger = logging.getLogger(__name__)

#: 2: files name the optimizer's parameters ("optim_param_names"), meta.json has the pp and
#: sp sizes; format 1 still loads, into the layout that wrote it
FORMAT = 2
_READABLE = (1, 2)
#: the parallel sizes that make a layout, as meta.json names them (absent: 1)
_SIZES = ("world_size", "dp_size", "tp_size", "pp_size", "sp_size")
#: the checkpoint's copy of a Hugging Face model's config and tokenizer
HF_DIR = "hf"
#: the pointer file naming the published version
CURRENT = "CURRENT"
#: the file naming the version a save in progress writes (for the ranks other than 0)
PENDING = "PENDING"
_VERSION = re.compile(r"^v(\d{6,})$")


def _rank_file(rank: int, world: int) -> str:
    return f"rank_{rank:05d}_of_{world:05d}.pt"


def _barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def _versions(root: Path) -> list[tuple[int, Path]]:
    """The complete versions in ``root`` (renamed from ``.tmp``, so complete), oldest first."""
    found: list[tuple[int, Path]] = []
    if root.is_dir():
        for child in root.iterdir():
            match = _VERSION.match(child.name)
            if match and child.is_dir() and (child / "meta.json").is_file():
                found.append((int(match.group(1)), child))
    return sorted(found)


def published_checkpoint(local_path: str | os.PathLike[str]) -> Path | None:
    """The directory holding the checkpoint a reader of ``local_path`` should load, or
    ``None``: the version ``CURRENT`` names, else the newest complete version, else
    ``local_path`` itself when it holds a checkpoint of sc-workers 0.1."""
    root = Path(local_path)
    current = root / CURRENT
    if current.is_file():
        name = current.read_text(encoding="utf-8").strip()
        candidate = root / name
        if _VERSION.match(name) and (candidate / "meta.json").is_file():
            return candidate
        logger.warning("%s names %r, which is not a complete checkpoint", current, name)
    versions = _versions(root)
    if versions:
        return versions[-1][1]
    if (root / "meta.json").is_file():
        return root
    return None


def published_step(local_path: str | os.PathLike[str]) -> int | None:
    """The global step of the checkpoint published in ``local_path`` (what a load would
    read), or ``None`` when it holds none. A driver uses it to learn, from the filesystem
    alone, that a background save has completed even when it cannot ask the workers."""
    root = published_checkpoint(local_path)
    if root is None:
        return None
    try:
        meta = json.loads((root / "meta.json").read_text(encoding="utf-8"))
        return int(meta["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_pointer(root: Path, name: str, value: str) -> None:
    tmp = root / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(value)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, root / name)
    _fsync_dir(root)


def _begin(root: Path) -> Path:
    """Rank 0: clear what dead saves left, and open the next version's ``.tmp`` directory."""
    root.mkdir(parents=True, exist_ok=True)
    for child in root.iterdir():
        if child.name.endswith(".tmp") and _VERSION.match(child.name.removesuffix(".tmp")):
            shutil.rmtree(child, ignore_errors=True)
    versions = _versions(root)
    number = versions[-1][0] + 1 if versions else 1
    tmp = root / f"v{number:06d}.tmp"
    tmp.mkdir()
    _write_pointer(root, PENDING, tmp.name)
    return tmp


def _publish(root: Path, tmp: Path) -> Path:
    """Rank 0: make the complete ``tmp`` the published version; old versions go last."""
    final = tmp.with_name(tmp.name.removesuffix(".tmp"))
    os.rename(tmp, final)
    _fsync_dir(root)
    _write_pointer(root, CURRENT, final.name)
    for old in root.iterdir():  # every other version, complete or half-removed
        if old != final and _VERSION.match(old.name):
            shutil.rmtree(old, ignore_errors=True)
    for stale in [root / "meta.json", *root.glob("rank_*_of_*.pt")]:  # a 0.1 layout
        stale.unlink(missing_ok=True)
    shutil.rmtree(root / HF_DIR, ignore_errors=True)
    (root / PENDING).unlink(missing_ok=True)
    return final


def save_engine_checkpoint(
    engine: Engine,
    local_path: str,
    global_step: int,
    extra: dict[str, Any],
    *,
    background: bool = False,
) -> BackgroundSave | None:
    """Write this rank's shard; rank 0 publishes the version (see the module docstring).

    With ``background``, the shard is copied now and written by a thread
    (:mod:`._checkpoint_background`); the returned :class:`BackgroundSave` says when the
    version is published (rank 0) or this rank's file is written (the others)."""
    layout = engine.layout
    root = Path(local_path)
    if layout.rank == 0:
        tmp = _begin(root)
    _barrier()
    if layout.rank != 0:
        tmp = root / (root / PENDING).read_text(encoding="utf-8").strip()
    # A background save of a CPU engine writes the live tensors (no copy of the whole state):
    # the worker's next update waits until this rank's file is written. Elsewhere the move
    # to the CPU is the copy.
    state = engine.local_state_dict(copy=not (background and engine.device.type == "cpu"))
    state["rng"] = capture_rng(engine.device)
    state["extra"] = extra
    meta = _meta(engine, global_step) if layout.rank == 0 else None
    source = engine.model_config.path if engine.hf_kind is not None else None
    where = f"save_checkpoint (rank {layout.rank})"
    if background:

        def write(cancel: threading.Event, written: threading.Event) -> None:
            _write_shard(state, tmp, layout.rank, layout.world_size)
            written.set()
            if meta is not None:
                expected = {_rank_file(r, layout.world_size) for r in range(layout.world_size)}
                wait_for_files(tmp, expected, PG_TIMEOUT.get(worker_environ()), cancel, where)
                _write_meta_and_publish(root, tmp, meta, source, global_step)

        return BackgroundSave(where, global_step, write)
    _write_shard(state, tmp, layout.rank, layout.world_size)
    _barrier()
    if meta is not None:
        expected = {_rank_file(r, layout.world_size) for r in range(layout.world_size)}
        present = {p.name for p in tmp.iterdir()}
        if not expected <= present:
            raise CheckpointError(
                f"{where}: {tmp} lacks {sorted(expected - present)}; do all "
                "ranks share this filesystem?"
            )
        _write_meta_and_publish(root, tmp, meta, source, global_step)
    _barrier()
    return None


def _meta(engine: Engine, global_step: int) -> dict[str, Any]:
    layout = engine.layout
    meta: dict[str, Any] = {
        "format": FORMAT,
        "world_size": layout.world_size,
        "dp_size": layout.dp_size,
        "tp_size": layout.tp_size,
        "pp_size": layout.pp_size,
        "sp_size": layout.sp_size,
        "strategy": engine.strategy,
        "global_step": global_step,
    }
    kind = engine.hf_kind
    source = engine.model_config.path
    if kind is not None and source is not None:
        meta["hf"] = {"kind": kind, "source": source}
    return meta


#: torch's save settings are process-wide: one shard write at a time changes them
_SAVE_SETTINGS_LOCK = threading.Lock()


@contextlib.contextmanager
def _without_crc32() -> Iterator[None]:
    """``torch.save`` without the CRC32 of every zip record, about two thirds of its CPU time
    on large tensors (CPU a background save takes from training): a shard's completeness
    comes from the atomic publish, and the files load as usual."""
    save_config = torch.utils.serialization.config
    with _SAVE_SETTINGS_LOCK:
        before = save_config.save.compute_crc32
        save_config.save.compute_crc32 = False
        try:
            yield
        finally:
            save_config.save.compute_crc32 = before


def _write_shard(state: dict[str, Any], tmp: Path, rank: int, world: int) -> None:
    name = _rank_file(rank, world)
    partial = tmp / (name + ".partial")
    with _without_crc32():
        torch.save(state, partial)
    os.replace(partial, tmp / name)


def _write_meta_and_publish(
    root: Path, tmp: Path, meta: dict[str, Any], hf_source: str | None, global_step: int
) -> None:
    """Rank 0, once every rank's file is in ``tmp``: the side files, ``meta.json`` (written
    last: a version without it is incomplete), then publish."""
    if hf_source is not None:
        copy_hf_side_files(hf_source, tmp / HF_DIR, include_config=True)
    (tmp / "meta.json").write_text(json.dumps(meta, indent=2))
    final = _publish(root, tmp)
    logger.info("saved checkpoint at step %d to %s", global_step, final)


def _load_file(path: Path, **kwargs: Any) -> dict[str, Any]:
    """``torch.load`` with ``weights_only=True``: tensors and plain values, no code."""
    try:
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True, **kwargs)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds Python objects that safe loading refuses; it was not written by "
            f"sc-workers' save_checkpoint ({str(exc).splitlines()[0] if str(exc) else exc})"
        ) from exc
    return state


def _read_meta(root: Path, where: str) -> dict[str, Any]:
    meta_file = root / "meta.json"
    if not meta_file.is_file():
        raise CheckpointError(f"{where}: {meta_file} does not exist; not a complete checkpoint")
    meta: dict[str, Any] = json.loads(meta_file.read_text())
    if meta.get("format") not in _READABLE:
        raise CheckpointError(
            f"{where}: {root} has format {meta.get('format')}, expected one of {_READABLE}"
        )
    return meta


def load_engine_checkpoint(engine: Engine, local_path: str) -> dict[str, Any]:
    """Restore this rank's part of the checkpoint, from any layout (see the module
    docstring); returns the ``extra`` dict that was saved with it."""
    layout = engine.layout
    where = f"load_checkpoint (rank {layout.rank})"
    root = published_checkpoint(local_path)
    if root is None:
        raise CheckpointError(f"{where}: {local_path} holds no complete checkpoint")
    meta = _read_meta(root, where)
    saved = tuple(int(meta.get(key, 1)) for key in _SIZES)
    now = (layout.world_size, layout.dp_size, layout.tp_size, layout.pp_size, layout.sp_size)
    if saved == now:
        shard = root / _rank_file(layout.rank, layout.world_size)
        if not shard.is_file():
            raise CheckpointError(f"{where}: {shard} does not exist")
        state = _load_file(shard)
        if not blocks_differ(state, engine.module):
            engine.load_local_state_dict(state, str(shard))
            restore_rng(state["rng"], engine.device)
            extra: dict[str, Any] = state.get("extra", {})
            return extra
    if meta["format"] < 2:
        raise CheckpointError(
            f"{where}: {root} was written with world size {saved[0]} (dp {saved[1]}, tp "
            f"{saved[2]}) and other blocks than this group's, world size {now[0]} (dp "
            f"{now[1]}, tp {now[2]}); its format {meta['format']} does not name the optimizer's "
            "parameters, which loading into another layout needs: load it with the layout "
            "that wrote it and save it again"
        )
    return _load_resharded(engine, root, meta, where)


def _load_resharded(engine: Engine, root: Path, meta: dict[str, Any], where: str) -> dict[str, Any]:
    """Build this rank's state from every saved rank's memory-mapped file (:mod:`._reshard`)."""
    layout = engine.layout
    world = int(meta["world_size"])
    logger.info(
        "%s: loading %s (world size %d, dp %s, tp %s) into world size %d (dp %d, tp %d)",
        where, root, world, meta.get("dp_size"), meta.get("tp_size"),
        layout.world_size, layout.dp_size, layout.tp_size,
    )  # fmt: skip
    where = f"{where}: {root}"
    files: list[SavedRank] = []
    for rank in range(world):
        path = root / _rank_file(rank, world)
        if not path.is_file():
            raise CheckpointError(f"{where}: {path.name} does not exist")
        files.append(SavedRank(rank, path, _load_file(path, mmap=True)))
    engine.load_local_state_dict(resharded_state(engine, files, where), str(root))
    first = files[0].state.get("extra", {})
    shared = {key: first[key] for key in SHARED_EXTRA if key in first}
    source = rng_source(meta, layout, where)
    if source is None:
        logger.info(
            "%s: the checkpoint has no dp rank %d (dp size %s); this rank keeps its RNG states "
            "and per-rank counters (the sampler's generator) as initialised",
            where, layout.dp_rank, meta.get("dp_size"),
        )  # fmt: skip
        return shared
    restore_rng(files[source].state["rng"], engine.device)
    return {**files[source].state.get("extra", {}), **shared}


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
    where = f"export_hf_checkpoint({str(checkpoint_dir)!r})"
    found = published_checkpoint(checkpoint_dir)
    if found is None:
        raise CheckpointError(f"{where}: no complete checkpoint there")
    root = found
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
        state = _load_file(path, mmap=True)
        if "model_chunks" not in state:
            raise CheckpointError(f"{where}: {path} has no block layout (model_chunks)")
        shards.append(state)
    names = list(dict.fromkeys(name for state in shards for name in state["model"]))
    full: dict[str, torch.Tensor] = {}
    for name in names:  # a pipeline stage's file holds that stage's parameters only
        blocks = [
            (_rank_file(rank, world), *state["model_chunks"][name], state["model"][name])
            for rank, state in enumerate(shards)
            if name in state["model"]
        ]
        full[name] = assemble_full(where, name, blocks)
    save_hf_model(full, kind, root / HF_DIR, out_dir)
    return str(out_dir)
