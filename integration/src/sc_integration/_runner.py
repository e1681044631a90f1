"""Assembling a run: roles to worker classes and pools, the launcher, the trainer, the output.

:class:`TaskRunner` is the driver's entry point (verl's name): it maps roles to worker classes
and resource pools, starts the backend through its launcher, builds the
:class:`~sc_integration.RayPPOTrainer`, trains, and writes the plot and the call trace.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

from sc_core import SpanRecorder
from sc_rollout import find_vllm_env
from sc_workers import ActorRolloutRefWorker, CriticWorker, RolloutWorker, load_hf_tokenizer

from ._agent_rollout import AgentEnvironment
from ._config import TrainerConfig
from ._errors import TrainerConfigError
from ._launchers import Launcher, make_launcher
from ._output import RunOutput, check_resumable, resolve_checkpoint
from ._roles import Role
from ._task import DigitsTask
from ._text_task import TextDigitsTask
from ._tiny_gpt2 import save_tiny_gpt2
from ._tool_task import TOOL_CALC_CHARS, ToolCalcTask
from ._trainer import ProgressFn, RayPPOTrainer, RunResult

__all__ = ["TaskRunner", "make_task", "with_server_model"]

logger = logging.getLogger(__name__)


def with_server_model(config: TrainerConfig) -> TrainerConfig:
    """``config``, with a model an engine server can load when it generates on servers
    (``rollout_engine`` builtin or vllm) and names none: a tiny GPT-2 written to
    ``<output_dir>/model`` (once; a resumed run finds it there)."""
    if config.rollout_engine == "workers" or config.model_path is not None:
        return config
    folder = Path(config.output_dir) / "model"
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        chars = TOOL_CALC_CHARS if config.task.mode == "tool-calc" else None
        save_tiny_gpt2(folder, seed=config.seed, chars=chars)
        logger.info("wrote a tiny GPT-2 for the %s rollout to %s", config.rollout_engine, folder)
    return dataclasses.replace(config, model_path=str(folder.resolve()))


def make_task(config: TrainerConfig) -> DigitsTask | AgentEnvironment:
    """The task of a run: token by token for the built-in model, as text through the
    tokenizer of the Hugging Face model at ``config.model_path``; the tool task (on engine
    servers, so always a Hugging Face model) through that tokenizer too."""
    if config.task.mode == "tool-calc":
        if config.model_path is None:
            raise TrainerConfigError(
                "make_task: the tool task needs a Hugging Face model (model_path); "
                "with_server_model writes one"
            )
        return ToolCalcTask(load_hf_tokenizer(config.model_path))
    if config.model_path is None:
        return DigitsTask(config.task)
    return TextDigitsTask(config.task, load_hf_tokenizer(config.model_path))


class TaskRunner:
    """Assembles a run: roles → worker classes, roles → resource pools, then train.

    ``run`` starts the backend through its launcher (a local Ray cluster for
    ``backend="ray"``), builds the trainer, calls ``init_workers`` and ``fit``, writes the
    plot and the trace, and stops the backend again.
    """

    def __init__(self, config: TrainerConfig) -> None:
        self.config = with_server_model(config)

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

    def build_trainer(self, launcher: Launcher) -> RayPPOTrainer:
        """The trainer of this run, its workers built by ``launcher`` (in ``init_workers``)."""
        cfg = self.config
        spec, mapping = self.resource_pool_spec()
        return RayPPOTrainer(
            cfg,
            make_task(cfg),
            self.role_worker_mapping(),
            launcher.resource_pool_manager(spec, mapping),
            launcher,
            RunOutput(cfg.output_dir),
        )

    def run(
        self, progress: ProgressFn | None = None, on_start: Callable[[int], None] | None = None
    ) -> RunResult:
        """Train as configured; ``progress(step, metrics)`` after every step."""
        cfg = self.config
        if cfg.rollout_engine == "vllm":
            find_vllm_env()  # EngineNotInstalledError, naming the command, before any worker
        resume = None if cfg.resume_from is None else resolve_checkpoint(cfg.resume_from)
        if resume is not None:
            check_resumable(resume, cfg)  # before any worker starts
        started = time.perf_counter()
        startup: list[float] = []

        def begin(step: int) -> None:
            startup.append(time.perf_counter() - started)
            if on_start is not None:
                on_start(step)

        launcher = make_launcher(cfg)
        recorder = SpanRecorder()
        with launcher.running(), recorder:
            trainer = self.build_trainer(launcher)
            try:
                trainer.init_workers()
                result = trainer.fit(progress=progress, on_start=begin, resume_from=resume)
            except BaseException:
                if launcher.session is not None:  # a detached run outlives this driver
                    trainer.detach()
                else:
                    trainer.close()
                raise
            finally:
                recorder.write_chrome_trace(trainer.output.trace_path)
            trainer.close()
        trainer.output.write_plot(result.history)
        return dataclasses.replace(result, startup_seconds=startup[0] if startup else 0.0)
