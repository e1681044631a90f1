"""What the actor and critic workers share: set-up, data access, checkpoint bookkeeping, and
what their collective methods do when one rank fails (see :mod:`._collective`)."""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from sc_core import Worker, worker_environ
from sc_dispatch import Dispatch, register
from sc_protocol import DataProto

from .._config import ConfigBase, ParallelSizes
from .._errors import (
    CheckpointError,
    CollectiveAbortedError,
    ConfigError,
    DistributedError,
    NotInitializedError,
    PipelineStageError,
)
from .._settings import PG_TIMEOUT
from ..engine import Engine, ParallelLayout, init_distributed, resolve_device
from ..engine._groups import RECORD_WAIT_S, FailureRecord, groups
from ..models import save_hf_model
from ._checkpoint import load_engine_checkpoint, save_engine_checkpoint
from ._checkpoint_background import BackgroundSave
from ._collective import add_note, detach_traceback, error_summary, is_peer_failure
from ._rng import capture_rng, restore_rng
from ._sync import WeightSyncEndpoint

__all__ = ["ENGINE_ATTRS", "WorkerBase", "worker_config"]

#: The attributes sc-workers' workers keep their engines in (dropped when the group re-forms).
ENGINE_ATTRS = ("actor_engine", "ref_engine", "critic_engine", "rollout_engine")

logger = logging.getLogger(__name__)

R = TypeVar("R")
C = TypeVar("C", bound=ConfigBase)

#: an engine's state kept through a teardown, by the attribute that holds the engine
KeptState = Mapping[str, dict[str, Any]]


def worker_config(cls: type[C], config: object, worker: str) -> C:
    """A worker's ``config`` argument as ``cls``: a mapping is read with ``cls.from_dict``;
    anything else but a ``cls`` raises :class:`ConfigError` naming ``worker``."""
    if isinstance(config, Mapping):
        config = cls.from_dict(config)
    if not isinstance(config, cls):
        article = "an" if cls.__name__[0] in "AEIOU" else "a"
        raise ConfigError(
            f"{worker}: config must be {article} {cls.__name__} or a mapping, got "
            f"{type(config).__name__}"
        )
    return config


class WorkerBase(Worker):
    """Device choice, process-group set-up and checkpoint retention for sc-workers' workers."""

    layout: ParallelLayout
    device: torch.device

    def _setup_identity(self, device: str, sizes: ParallelSizes) -> None:
        self.layout = ParallelLayout.create(
            self.world_size, self.rank, tp_size=sizes.tp, pp_size=sizes.pp, sp_size=sizes.sp
        )
        self.device = resolve_device(device, worker_environ())
        self._saved_checkpoints: list[str] = []
        self._pending_save: BackgroundSave | None = None
        self._update_steps = 0
        #: the engines' states kept when a failure tore the process groups down, until the
        #: next call rebuilds the engines from them; what could not be kept, and why
        self._kept_engines: dict[str, dict[str, Any]] | None = None
        self._lost_engines: dict[str, str] = {}

    # --------------------------------------------------- failures and rebuilds
    def _build_engines(self, kept: KeptState | None = None) -> None:
        """Build the worker's engines (on the current process group), loading ``kept`` (the
        states :meth:`release_groups` kept) into them when given. Subclasses implement it;
        ``init_model`` calls it without ``kept``."""
        raise NotImplementedError(f"{type(self).__name__} builds no engines")

    def release_groups(self) -> None:
        """Keep each engine's state (no collective) and drop the engines: the process groups
        are about to be torn down, and every reference to them must go (see
        :mod:`sc_workers.engine._groups`). A worker whose kept state is not yet restored (a
        rebuild that failed) keeps that one."""
        if self._kept_engines is None:
            kept: dict[str, dict[str, Any]] = {}
            for name in ENGINE_ATTRS:
                engine = self.__dict__.get(name)
                if not isinstance(engine, Engine) or not engine.built:
                    continue
                try:
                    kept[name] = engine.kept_state()
                except Exception as exc:
                    logger.exception("rank %d: could not keep the state of %s", self.rank, name)
                    self._lost_engines[name] = error_summary(exc)
            self._kept_engines = kept or None
        for name in ENGINE_ATTRS:
            if name in self.__dict__:
                setattr(self, name, None)
        if isinstance(self, WeightSyncEndpoint):  # staged into the dropped engine's tensors
            self._sync_drop_staged()

    def _collective_call(self, method: str, run: Callable[[], R], tear_down: bool) -> R:
        """Run ``run()`` (the body of a ``@collective`` method; ``tear_down``: whether an
        error tears the process groups down); see :mod:`._collective`."""
        if self.world_size == 1:
            return run()
        pg = groups()
        call = pg.next_call()
        where = self._where(method)
        peer: FailureRecord | None = None
        own = False
        seen = detail = ""
        try:
            self._catch_up(where, call)
            return run()
        except Exception as exc:
            error = exc
            if tear_down and pg.active and not isinstance(exc, NotInitializedError):
                summary = error_summary(exc)
                published = pg.failure()  # a peer failed first (this rank's error may be a timeout)
                if published is not None and published.rank != self.rank:
                    peer = published
                elif is_peer_failure(exc):
                    peer = pg.failure(RECORD_WAIT_S)
                    if peer is None:  # no rank said why: one died, or its network broke
                        lost = FailureRecord(
                            None, where, f"rank {self.rank} lost a peer: {summary}"
                        )
                        peer = pg.publish(lost) or lost
                else:
                    own = True
                    pg.publish(FailureRecord(self.rank, where, summary))
                seen = summary
                detail = detach_traceback(exc)  # its frames hold the engines, and they the groups
        if not (own or peer is not None):
            raise error
        pg.tear_down(call)
        if peer is None:
            add_note(
                error,
                f"rank {self.rank} failed in {where}; it published its error and tore its "
                "process groups down, so that its peers' collectives fail at once; the next "
                f"call rebuilds them. The error as it was raised:\n{detail}",
            )
            raise error
        cls = (
            PipelineStageError if isinstance(error, PipelineStageError) else CollectiveAbortedError
        )
        aborted = cls(
            f"{where}: aborted because {peer.describe()}. The failed rank tore its process "
            "groups down so that no rank waits for SC_WORKERS_PG_TIMEOUT_S; this rank's "
            f"collective failed ({seen}), and it tore its groups down too. The next call "
            "rebuilds them, with the model, optimizer and schedule this rank holds.",
            failed_rank=peer.rank,
            root_error=peer.error,
        )
        aborted.sc_caused_by_peer = True
        raise aborted from None

    def _catch_up(self, where: str, call: int) -> None:
        """Before call number ``call``: tear the groups down if a peer published a failure
        of them (this rank finished its call before the peer failed); after a teardown,
        join the next generation once every rank acknowledged it, and rebuild this worker's
        engines from the state they kept."""
        pg = groups()
        if pg.active:
            record = pg.failure()
            if record is not None:
                logger.warning(
                    "rank %d: %s; tearing the process groups down before %s",
                    self.rank,
                    record.describe(),
                    where,
                )
                pg.tear_down(call - 1)
        if pg.torn_down:
            self._rejoin(where, call)
        if self._kept_engines is not None or self._lost_engines:
            self._restore_engines(where)

    def _rejoin(self, where: str, call: int) -> None:
        """Join the process groups' next generation, once every rank tore the old one down;
        abort call ``call`` if a rank ran it on the old groups (a non-blocking call that was
        already running there)."""
        pg = groups()
        record = pg.failure()
        cause = record.describe() if record is not None else "a rank failed"
        timeout = PG_TIMEOUT.get(worker_environ())
        acks = pg.acknowledged_calls(timeout)
        missing = [r for r in range(self.world_size) if r not in acks]
        if missing:
            raise CollectiveAbortedError(
                f"{where}: the process groups were torn down after {cause}, and ranks "
                f"{missing} did not tear theirs down within {timeout:g} s "
                "(SC_WORKERS_PG_TIMEOUT_S); a rank that died must be replaced "
                "(WorkerGroup.replace_ranks) before the groups can be rebuilt",
                failed_rank=None if record is None else record.rank,
                root_error="" if record is None else record.error,
            )
        last = max(acks.values())
        if call <= last:
            late = min(r for r, n in acks.items() if n == last)
            raise CollectiveAbortedError(
                f"{where}: aborted: rank {late} had started this call on the process groups "
                f"that were torn down after {cause}; the next call rebuilds them",
                failed_rank=None if record is None else record.rank,
                root_error="" if record is None else record.error,
            )
        self._init_distributed()

    def _restore_engines(self, where: str) -> None:
        """Rebuild the engines on the new process groups from the state they kept."""
        kept, lost = self._kept_engines, self._lost_engines
        if lost:
            self._kept_engines, self._lost_engines = None, {}
            raise NotInitializedError(
                f"{where}: the state of {sorted(lost)} could not be kept when the process "
                f"groups were torn down ({'; '.join(lost.values())}); call init_model again "
                "and load a checkpoint"
            )
        rng = capture_rng(self.device)
        self._build_engines(kept)
        restore_rng(rng, self.device)
        self._kept_engines = None
        logger.warning(
            "rank %d: rebuilt %s on the new process groups, with the state they kept",
            self.rank,
            sorted(kept or {}),
        )

    def _restore_engine(self, engine: Engine, name: str, kept: KeptState | None) -> None:
        """Load the state kept for the engine of attribute ``name`` into ``engine``."""
        if kept is not None and name in kept:
            engine.load_local_state_dict(kept[name], "the state kept through a teardown")

    def _run_update(
        self,
        engine: Engine,
        prefix: str,
        data_loader_seed: int,
        step: Callable[[int], dict[str, float]],
    ) -> DataProto:
        """One optimizer update: ``step(seed)`` on the device, then the lr schedule.

        The seed differs per update (and survives checkpoints), so shuffled mini-batches
        differ between updates yet replay exactly after a resume.
        """
        seed = data_loader_seed * 1_000_003 + self._update_steps
        if self._pending_save is not None:  # it may be writing the tensors this update changes
            self._pending_save.wait_written()
        with engine.on_device(with_optimizer=True):
            lr = engine.get_lr()
            metrics = step(seed)
            engine.lr_scheduler_step()
        metrics[f"{prefix}/lr"] = lr
        self._update_steps += 1
        return DataProto(meta_info={"metrics": metrics})

    def on_group_reformed(self, replaced: list[int]) -> None:
        """The group replaced ``replaced`` and re-forms (see ``WorkerGroup.replace_ranks``):
        leave the weight-sync channel, drop the engines (their sharded models and device
        meshes live on the old process group) and destroy the process group. The driver then
        calls ``init_model`` again, which joins a new process group at the new address; a
        trainer restores its checkpoint after that. (The dispatch meshes a worker registers in
        its constructor depend on its rank only and stay as they are.)"""
        if isinstance(self, WeightSyncEndpoint):
            self._sync_forget()
        pending, self._pending_save = self._pending_save, None
        if pending is not None:  # its version waits for ranks that are gone: abandon it
            pending.cancel()
        for name in ENGINE_ATTRS:
            if name in self.__dict__:
                setattr(self, name, None)
        self._kept_engines, self._lost_engines = None, {}
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        groups().forget()
        logger.info("rank %d: left the process group; ranks %s were replaced", self.rank, replaced)

    def _where(self, method: str) -> str:
        return f"{type(self).__name__}.{method} (rank {self.rank})"

    def _init_sampling(self, seed: int) -> torch.Generator:
        """``init_model`` of a worker that samples: join the process group, build the
        engines, and return the sampling generator, seeded by ``seed`` and the dp rank (the
        replicas draw different samples)."""
        self._init_distributed()
        self._build_engines()
        return torch.Generator(device=self.device).manual_seed(
            seed * 1_000_003 + self.layout.dp_rank
        )

    def _init_distributed(self) -> None:
        if self.world_size > 1 and worker_environ().get("WG_BACKEND") == "local":
            raise DistributedError(
                f"{self._where('init_model')}: world size {self.world_size} under the "
                "in-process backend (LocalWorkerGroup); its ranks share one process, and "
                "multi-rank collectives need a multi-process backend (sc_ray.RayWorkerGroup). "
                "Use world size 1 in-process."
            )
        addr, port = self.get_master_addr_port()
        init_distributed(self.world_size, self.rank, self.device, addr, port, worker_environ())
        if self.world_size > 1:
            groups().add_holder(self)

    def _save(
        self,
        engine: Engine,
        local_path: str,
        hdfs_path: str | None,
        global_step: int,
        max_ckpt_to_keep: int | None,
        extra: dict[str, Any],
        background: bool = False,
    ) -> None:
        where = self._where("save_checkpoint")
        if hdfs_path is not None:
            raise ConfigError(
                f"{where}: hdfs_path {hdfs_path!r} is not supported; copy the "
                "local checkpoint yourself"
            )
        if max_ckpt_to_keep is not None and max_ckpt_to_keep < 1:
            raise ConfigError(f"{where}: max_ckpt_to_keep must be >= 1, got {max_ckpt_to_keep}")
        if not isinstance(background, bool):
            raise ConfigError(f"{where}: background must be a bool, got {background!r}")
        self._finish_pending_save(None)  # one save at a time: the previous one finishes first
        extra = {**extra, "update_steps": self._update_steps, "global_step": global_step}
        with engine.on_device(with_optimizer=True):
            pending = save_engine_checkpoint(
                engine, local_path, global_step, extra, background=background
            )
        self._pending_save = pending
        path = str(Path(local_path))
        if path in self._saved_checkpoints:
            self._saved_checkpoints.remove(path)
        self._saved_checkpoints.append(path)
        if max_ckpt_to_keep is not None:
            while len(self._saved_checkpoints) > max_ckpt_to_keep:
                old = self._saved_checkpoints.pop(0)
                if self.rank == 0:
                    shutil.rmtree(old, ignore_errors=True)
                    logger.info("removed old checkpoint %s", old)

    def _finish_pending_save(self, timeout_s: float | None) -> bool:
        """Wait up to ``timeout_s`` for this rank's background save; ``True`` when none is
        left. Raises :class:`CheckpointError` if it failed."""
        pending = self._pending_save
        if pending is None:
            return True
        if not pending.wait(timeout_s):
            return False
        self._pending_save = None
        return True

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def wait_checkpoint(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds (``None``: until it is done; ``0``: just ask) for
        the save started with ``save_checkpoint(..., background=True)``. ``True`` once this
        rank's part is written (rank 0: once the version is published) or when no save is
        pending. Raises :class:`CheckpointError` if the save failed."""
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout < 0):
            raise ConfigError(
                f"{self._where('wait_checkpoint')}: timeout must be None or a number >= 0, "
                f"got {timeout!r}"
            )
        return self._finish_pending_save(None if timeout is None else float(timeout))

    def _load(
        self, engine: Engine, local_path: str, hdfs_path: str | None, del_local_after_load: bool
    ) -> dict[str, Any]:
        where = self._where("load_checkpoint")
        try:
            self._finish_pending_save(None)
        except CheckpointError as exc:  # that save is lost; what is loaded is unaffected
            logger.warning("%s: %s", where, exc)
        if hdfs_path is not None:
            raise ConfigError(f"{where}: hdfs_path {hdfs_path!r} is not supported")
        if not Path(local_path).is_dir():
            raise CheckpointError(f"{where}: {local_path} is not a directory")
        with engine.on_device(with_optimizer=True):
            extra = load_engine_checkpoint(engine, local_path)
        self._update_steps = int(extra.get("update_steps", 0))
        if del_local_after_load:
            if torch.distributed.is_initialized() and self.world_size > 1:
                torch.distributed.barrier()
            if self.rank == 0:
                shutil.rmtree(local_path, ignore_errors=True)
        return extra

    def _export_hf(self, engine: Engine, local_path: str) -> None:
        """Gather the full weights (a collective) and write them, on rank 0, as a
        ``save_pretrained`` directory with the source's config and tokenizer."""
        where = self._where("export_hf_model")
        kind = engine.hf_kind
        source = engine.model_config.path
        if kind is None or source is None:
            raise ConfigError(
                f"{where}: the built-in model has no Hugging Face format; export needs a "
                "model loaded from model.path"
            )
        with engine.on_device():
            state = engine.full_state_dict()
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                save_hf_model(state, kind, source, local_path)
            except Exception as exc:  # re-raised below, after the other ranks hear of it
                failure = exc
        if torch.distributed.is_initialized() and self.world_size > 1:
            # every rank learns whether rank 0 wrote the directory (no rank waits forever)
            flag = torch.tensor([0 if failure is None else 1], device=engine.device)
            torch.distributed.all_reduce(flag)
            if failure is None and int(flag.item()):
                raise CheckpointError(f"{where}: rank 0 failed to write {local_path}")
        if failure is not None:
            raise failure
