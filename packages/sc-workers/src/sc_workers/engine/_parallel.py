"""Rank layout, device choice and process-group set-up shared by the engines."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from .._errors import ConfigError, DistributedError
from .._settings import DEVICE, PG_TIMEOUT

__all__ = ["ParallelLayout", "init_distributed", "resolve_device"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelLayout:
    """Where one rank sits in a ``dp x tp`` grid (tp fastest: rank = dp_rank * tp + tp_rank).

    Pipeline parallelism is not implemented (``pp_size`` is always 1), so the last pipeline
    stage is every rank and the collect rank of a dp group is its tp rank 0.
    """

    world_size: int
    rank: int
    dp_size: int
    tp_size: int

    @classmethod
    def create(cls, world_size: int, rank: int, tp_size: int = 1) -> ParallelLayout:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside world size {world_size}")
        if tp_size < 1 or world_size % tp_size:
            raise ConfigError(
                f"world size {world_size} is not divisible by tensor_model_parallel_size {tp_size}"
            )
        return cls(world_size, rank, world_size // tp_size, tp_size)

    @property
    def dp_rank(self) -> int:
        return self.rank // self.tp_size

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def pp_size(self) -> int:
        return 1

    @property
    def is_collect(self) -> bool:
        """Whether this rank's outputs are returned (tp rank 0 on the last pipeline stage)."""
        return self.tp_rank == 0


def resolve_device(requested: str, env: Mapping[str, str] | None = None) -> torch.device:
    """The device for this process: ``SC_WORKERS_DEVICE``, else ``requested``.

    ``requested`` is "auto" (CUDA when available, else CPU), "cpu" or "cuda". With several
    visible GPUs the process takes ``LOCAL_RANK`` modulo their count. ``env`` is the
    worker's environment (``os.environ`` when omitted).
    """
    env = os.environ if env is None else env
    choice = (DEVICE.get(env) or requested).strip().lower()
    if choice not in ("auto", "cpu", "cuda"):
        raise ConfigError(f"device must be 'auto', 'cpu' or 'cuda', got {choice!r}")
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("device 'cuda' was requested but torch.cuda.is_available() is False")
    count = torch.cuda.device_count()
    index = 0 if count == 1 else int(env.get("LOCAL_RANK", "0")) % count
    torch.cuda.set_device(index)
    return torch.device("cuda", index)


def init_distributed(
    world_size: int,
    rank: int,
    device: torch.device,
    master_addr: str | None = None,
    master_port: str | int | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """Join (or create) the default process group for ``rank`` of ``world_size``.

    gloo on CPU; on CUDA, nccl for CUDA tensors and gloo for CPU tensors. A world of one
    uses an in-memory store (no port). A larger world rendezvous at ``master_addr`` /
    ``master_port`` (default: MASTER_ADDR / MASTER_PORT from ``env``). ``env`` is the
    worker's environment (``os.environ`` when omitted); collectives time out after
    ``SC_WORKERS_PG_TIMEOUT_S`` seconds from it (default 600). An existing group is reused
    when it has the same world size and rank.
    """
    if dist.is_initialized():
        have_world, have_rank = dist.get_world_size(), dist.get_rank()
        if (have_world, have_rank) != (world_size, rank):
            raise DistributedError(
                f"rank {rank}: torch.distributed is already initialised as rank {have_rank} of "
                f"world size {have_world}, but this worker is rank {rank} of {world_size}; "
                "several ranks in one process need a multi-process backend (sc-ray)"
            )
        return
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    env = os.environ if env is None else env
    timeout = timedelta(seconds=PG_TIMEOUT.get(env))
    if world_size == 1:
        store = dist.HashStore()  # type: ignore[attr-defined]  # not re-exported in stubs
        dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
        logger.info("initialised a single-rank %s process group (in-memory store)", backend)
        return
    addr = master_addr or env.get("MASTER_ADDR")
    port = master_port or env.get("MASTER_PORT")
    if not addr or not port:
        raise DistributedError(
            f"rank {rank} of world size {world_size}: no rendezvous address (MASTER_ADDR "
            f"{addr!r}, MASTER_PORT {port!r}); a multi-rank process group needs both"
        )
    dist.init_process_group(
        backend,
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=world_size,
        timeout=timeout,
    )
    logger.info(
        "rank %d of %d joined a %s process group at %s:%s", rank, world_size, backend, addr, port
    )
