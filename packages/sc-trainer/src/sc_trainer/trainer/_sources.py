"""Which rollout source a configuration asks for: the one place that looks at the kind."""

from __future__ import annotations

from pathlib import Path

from sc_workers import ActorRolloutRefConfig, WeightSync

from .._errors import TrainerConfigError
from ..agents import AgentEnvironment, AgentRollout
from ..config import TrainerConfig
from ..rollout import (
    AsyncRollout,
    EngineServers,
    PromptSource,
    RolloutSource,
    RouterSampling,
    ServerRollout,
    WorkerGroupRollout,
)
from ..runs import DetachedRun
from ..tasks import DatasetTask, DigitsTask, Task, TaskPrompts
from ._roles import TrainerGroups

__all__ = ["make_rollout_source"]


def make_rollout_source(
    config: TrainerConfig,
    task: Task,
    groups: TrainerGroups,
    run_dir: Path,
    worker_config: ActorRolloutRefConfig,
    detached: DetachedRun | None = None,
) -> tuple[RolloutSource, EngineServers | None]:
    """The rollout source of a run whose worker groups are ``groups``, and the engine servers
    it generates on (``None``: it generates on worker groups): engine servers
    (``rollout_engine`` builtin or vllm: agent sessions for an agent task, else the router
    rollout, partial with ``async_staleness``), or worker groups (the actor's, a separate
    rollout group's, or that group one step ahead with ``async_staleness``). In a detached
    run (``detached``) the servers are the run's: created and recorded, or adopted."""
    if config.rollout_engine != "workers":
        if config.model_path is None:
            raise TrainerConfigError(
                f"make_rollout_source: rollout_engine={config.rollout_engine!r} serves a "
                "Hugging Face model; model_path is None (TaskRunner writes a tiny GPT-2)"
            )
        run = None if detached is None else detached.driver.run
        servers = EngineServers(
            config.rollout_engine,
            config.model_path,
            config.rollout_servers,
            run_dir,
            groups.actor_rollout,
            seed=config.seed,
            device=config.device,
            run=run,
            exact_window=config.exact_window,
        )
        try:
            return _server_source(config, task, servers, worker_config), servers
        except BaseException:
            servers.close(detach=run is not None)  # a detached run's stay for the next driver
            raise
    if isinstance(task, AgentEnvironment):
        raise TrainerConfigError(
            "make_rollout_source: an agent task runs its sessions on engine servers "
            f"(rollout_engine 'builtin' or 'vllm'), got {config.rollout_engine!r}"
        )
    prompts = _prompts(config, task)
    dp_size = config.workers_per_role
    if groups.rollout is not None and config.async_staleness > 0:
        source: RolloutSource = AsyncRollout(
            groups.rollout,
            prompts,
            config.async_staleness,
            config.total_steps,
            weight_sync=WeightSync(groups.actor_rollout, groups.rollout),
            dp_size=dp_size,
            call_scope=None if detached is None else detached.launch_scope,
        )
    else:
        source = WorkerGroupRollout(groups.actor_rollout, prompts, dp_size, groups.rollout)
    return source, None


def _prompts(config: TrainerConfig, task: DigitsTask | DatasetTask) -> PromptSource:
    """Each step's prompts: the dataset's, or the built-in task's."""
    if isinstance(task, DatasetTask):
        return task.prompts
    return TaskPrompts(task, config.prompts_per_step, config.responses_per_prompt, config.seed)


def _server_source(
    config: TrainerConfig,
    task: Task,
    servers: EngineServers,
    worker_config: ActorRolloutRefConfig,
) -> RolloutSource:
    if isinstance(task, AgentEnvironment):
        return AgentRollout(
            servers.router,
            task,
            prompts_per_step=config.prompts_per_step,
            n=config.responses_per_prompt,
            extra_groups=config.agent_extra_groups,
            staleness=config.async_staleness,
            temperature=config.temperature,
            seed=config.seed,
            deadline_s=config.agent_deadline_s,
            servers=servers,
        )
    prompts = _prompts(config, task)
    sampling = RouterSampling.from_configs(worker_config.rollout, worker_config.model)
    return ServerRollout(
        servers,
        prompts,
        sampling,
        staleness=config.async_staleness,
        last_step=config.total_steps,
    )
