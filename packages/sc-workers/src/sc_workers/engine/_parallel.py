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
from ._groups import groups

__all__ = ["ParallelLayout", "init_distributed", "resolve_device"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ParallelLayout:
    """Where one rank sits in a ``pp x dp x sp x tp`` grid.

    The order is Megatron's: tensor-parallel ranks are adjacent, then sequence-parallel
    (Ulysses) ranks, then data-parallel ranks, and pipeline stages are the slowest, so
    ``rank = ((pp_rank * dp + dp_rank) * sp + sp_rank) * tp + tp_rank``. A megatron-style
    engine uses pp and tp (sp 1); the FSDP engine uses sp (pp and tp 1).

    Every rank of a dp group (all its stages, sp and tp ranks) works on the same dp chunk of
    a batch; the group's outputs come from its *collect* rank: tp rank 0 and sp rank 0 of
    the last pipeline stage.
    """

    world_size: int
    rank: int
    dp_size: int
    tp_size: int
    pp_size: int = 1
    sp_size: int = 1

    @classmethod
    def create(
        cls, world_size: int, rank: int, tp_size: int = 1, pp_size: int = 1, sp_size: int = 1
    ) -> ParallelLayout:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ConfigError(f"rank {rank} is outside world size {world_size}")
        sizes = {
            "tensor_model_parallel_size": tp_size,
            "pipeline_model_parallel_size": pp_size,
            "ulysses_sequence_parallel_size": sp_size,
        }
        for name, size in sizes.items():
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ConfigError(f"{name} must be a positive int, got {size!r}")
        model_parallel = tp_size * pp_size * sp_size
        if world_size % model_parallel:
            raise ConfigError(
                f"world size {world_size} is not divisible by tensor_model_parallel_size "
                f"{tp_size} x pipeline_model_parallel_size {pp_size} x "
                f"ulysses_sequence_parallel_size {sp_size} = {model_parallel}"
            )
        return cls(world_size, rank, world_size // model_parallel, tp_size, pp_size, sp_size)

    @property
    def tp_rank(self) -> int:
        return self.rank % self.tp_size

    @property
    def sp_rank(self) -> int:
        return (self.rank // self.tp_size) % self.sp_size

    @property
    def dp_rank(self) -> int:
        return (self.rank // (self.tp_size * self.sp_size)) % self.dp_size

    @property
    def pp_rank(self) -> int:
        return self.rank // (self.tp_size * self.sp_size * self.dp_size)

    @property
    def is_first_stage(self) -> bool:
        return self.pp_rank == 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp_size - 1

    @property
    def reads_batch(self) -> bool:
        """Whether this rank reads a batch's columns for scoring and training: the first
        stage reads the model inputs, the last the loss columns; a middle stage receives its
        inputs from the previous stage (with virtual stages, pipeline rank 0 still runs the
        first stage and rank pp - 1 the last)."""
        return self.is_first_stage or self.is_last_stage

    @property
    def is_collect(self) -> bool:
        """Whether this rank's outputs are returned (tp and sp rank 0 on the last stage)."""
        return self.tp_rank == 0 and self.sp_rank == 0 and self.is_last_stage


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
    when it has the same world size and rank. The rendezvous store (rank 0 hosts it) is kept
    by :mod:`._groups`: after a rank failed and the groups were torn down, joining again at
    the same address forms the group's next generation on it.
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
    groups().join(world_size, rank, backend, str(addr), str(port), timeout)
    logger.info(
        "rank %d of %d joined a %s process group at %s:%s", rank, world_size, backend, addr, port
    )
