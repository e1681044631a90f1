"""Assembling a run: roles to worker classes and pools, the launcher, the trainer, the output.

:class:`TaskRunner` is the driver's entry point (verl's name): it maps roles to worker classes
and resource pools, starts the backend through its launcher, builds the
:class:`~sc_trainer.RayPPOTrainer`, trains, and writes the plot and the call trace.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from sc_core import SpanRecorder
from sc_rollout.engines import find_vllm_env
from sc_workers import ActorRolloutRefWorker, CriticWorker, RolloutWorker

from .._errors import MissingExtraError
from ..config import TrainerConfig, resolved_document, write_document
from ..loggers import Tracking, make_trackers
from ..runs import (
    CONFIG_FILE,
    RunOutput,
    check_resumable,
    check_same_data,
    latest_checkpoint,
    resolve_checkpoint,
)
from ..tasks import DatasetTask, data_state, make_task, with_server_model
from ..trainer import Launcher, ProgressFn, RayPPOTrainer, Role, RunResult
from ._launchers import make_launcher

__all__ = ["TaskRunner"]

logger = logging.getLogger(__name__)


class TaskRunner:
    """Assembles a run: roles → worker classes, roles → resource pools, then train.

    The task is made when the runner is (a dataset is read and checked, a reward function
    loaded, before any worker starts), and a dataset run's length in epochs becomes steps.
    ``run`` writes the resolved configuration to ``<output_dir>/config.yaml``, starts the
    backend through its launcher (a local Ray cluster for ``backend="ray"``) and the
    experiment trackers, builds the trainer, calls ``init_workers`` and ``fit``, writes the
    plot and the trace, and stops everything again.
    """

    def __init__(self, config: TrainerConfig) -> None:
        config = with_server_model(config.with_absolute_paths())
        self.task = make_task(config)
        if isinstance(self.task, DatasetTask):
            config = config.with_steps(self.task.steps_per_epoch)
        self.config = config

    def role_worker_mapping(self) -> dict[Role, type]:
        mapping: dict[Role, type] = {Role.ActorRolloutRef: ActorRolloutRefWorker}
        if self.config.uses_critic:
            mapping[Role.Critic] = CriticWorker
        if self.config.placement == "separate":
            mapping[Role.Rollout] = RolloutWorker
        return mapping

    def resource_pool_spec(self) -> tuple[dict[str, list[int]], dict[Role, str]]:
        """Pools (processes per node) and the pool of each role."""
        cfg = self.config
        per_node = [cfg.workers_per_role // cfg.nnodes] * cfg.nnodes
        spec = {"global_pool": per_node}
        mapping = {Role.ActorRolloutRef: "global_pool"}
        if self.config.uses_critic:
            if self.config.colocate:
                mapping[Role.Critic] = "global_pool"
            else:
                spec["critic_pool"] = list(per_node)
                mapping[Role.Critic] = "critic_pool"
        if self.config.placement == "separate":
            spec["rollout_pool"] = list(per_node)
            mapping[Role.Rollout] = "rollout_pool"
        return spec, mapping

    def build_trainer(self, launcher: Launcher, tracking: Tracking | None = None) -> RayPPOTrainer:
        """The trainer of this run, its workers built by ``launcher`` (in ``init_workers``),
        each step's metrics also given to ``tracking``."""
        cfg = self.config
        spec, mapping = self.resource_pool_spec()
        return RayPPOTrainer(
            cfg,
            self.task,
            self.role_worker_mapping(),
            launcher.resource_pool_manager(spec, mapping),
            launcher,
            RunOutput(cfg.output_dir),
            tracking=tracking,
        )

    def resume_point(self) -> Path | None:
        """The checkpoint the run continues from: ``resume_from``'s, or with
        ``resume_mode="auto"`` the output folder's newest complete one (none: a new run);
        checked against this run's configuration and data before any worker starts."""
        cfg = self.config
        if cfg.resume_from is not None:
            resume: Path | None = resolve_checkpoint(cfg.resume_from)
        elif cfg.resume_mode == "auto":
            resume = latest_checkpoint(Path(cfg.output_dir) / "checkpoints")
        else:
            resume = None
        if resume is not None:
            check_resumable(resume, cfg)
            check_same_data(resume, data_state(self.task))
        return resume

    def run(
        self, progress: ProgressFn | None = None, on_start: Callable[[int], None] | None = None
    ) -> RunResult:
        """Train as configured; ``progress(step, metrics)`` after every step."""
        cfg = self.config
        if cfg.rollout_engine == "vllm":
            find_vllm_env()  # EngineNotInstalledError, naming the command, before any worker
        resume = self.resume_point()
        write_document(cfg, Path(cfg.output_dir) / CONFIG_FILE)
        started = time.perf_counter()
        startup: list[float] = []

        def begin(step: int) -> None:
            startup.append(time.perf_counter() - started)
            if on_start is not None:
                on_start(step)

        launcher = make_launcher(cfg)
        recorder = SpanRecorder()
        tracking = make_trackers(
            cfg.tracking.logger,
            Path(cfg.output_dir),
            project_name=cfg.tracking.project_name,
            experiment_name=cfg.tracking.experiment_name,
            config=resolved_document(cfg),
        )
        with contextlib.ExitStack() as stack:
            stack.callback(self.close)
            stack.callback(tracking.close)
            stack.enter_context(launcher.running())
            stack.enter_context(recorder)
            trainer = self.build_trainer(launcher, tracking)
            try:
                trainer.init_workers()
                result = trainer.fit(progress=progress, on_start=begin, resume_from=resume)
            except BaseException:
                if launcher.driver is not None:  # a detached run outlives this driver
                    trainer.detach()
                else:
                    trainer.close()
                raise
            finally:
                recorder.write_chrome_trace(trainer.output.trace_path)
            trainer.close()
        try:
            trainer.output.write_plot(result.history)
        except MissingExtraError as err:  # the plot is a convenience; the run is done
            logger.warning("%s (the metrics are in %s)", err, trainer.output.metrics_path)
        return dataclasses.replace(result, startup_seconds=startup[0] if startup else 0.0)

    def close(self) -> None:
        """Stop what the task runs (a dataset run's reward-function threads)."""
        if isinstance(self.task, DatasetTask):
            self.task.close()
