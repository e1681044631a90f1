"""The trainer's state and its worker groups: what every part of the trainer reads.

:class:`TrainerCore` is the base of :class:`~sc_integration.RayPPOTrainer`: the constructor
(the configuration, the task, the roles, the launcher, the output folder), the typed worker
groups once ``init_workers`` built them, their models, and the weight sync of a separately
placed rollout. The loop lives in ``_trainer.py``; checkpoints in ``_trainer_checkpoints.py``;
a detached run's take-over in ``_trainer_detached.py``; recovery in ``_trainer_recovery.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from sc_core import ResourcePoolManager, WorkerGroup
from sc_workers import ActorRolloutRefWorker, CriticWorker, RolloutWorker, WeightSync

from ._agent_rollout import AgentEnvironment, AgentRollout
from ._async_rollout import AsyncRollout
from ._config import TrainerConfig
from ._driver_faults import DriverFault, DriverFaults
from ._errors import TrainerStateError
from ._faults import FaultSpec
from ._launchers import Launcher
from ._output import PendingSave, RunOutput
from ._roles import Role, TrainerGroups, role_classes, worker_configs
from ._run_state import RunState
from ._server_rollout import ServerRollout
from ._task import DigitsTask

__all__ = ["TrainerCore"]


class TrainerCore:
    """The trainer's state and worker groups (see the module docstring)."""

    def __init__(
        self,
        config: TrainerConfig,
        task: DigitsTask | AgentEnvironment,
        role_worker_mapping: Mapping[Role, type],
        resource_pool_manager: ResourcePoolManager,
        launcher: Launcher,
        output: RunOutput,
    ) -> None:
        self.config = config
        self.task = task
        self.role_worker_mapping = dict(role_worker_mapping)
        self._classes = role_classes(self.role_worker_mapping)
        self.resource_pool_manager = resource_pool_manager
        self.launcher = launcher
        self.output = output
        self.use_critic = self._classes.critic is not None
        self.dp_size = config.workers_per_role
        self.actor_rollout_ref_config, self.critic_config = worker_configs(config, task)
        self.global_step = 0
        self.history: list[dict[str, Any]] = []
        self._groups: TrainerGroups | None = None
        self._weight_sync: WeightSync | None = None
        #: worker deaths this run recovered from (at most ``config.max_recoveries``)
        self.recoveries = 0
        self._faults: list[FaultSpec] = list(config.faults)  # each injected once
        #: faults that kill this driver (a detached run's re-attach tests)
        self._driver_faults = DriverFaults(DriverFault.parse_all(config.inject_fault))
        #: a detached run's call ids, call scopes and run state (None: not detached)
        self._session = launcher.session
        #: a re-attached driver: the state its predecessor wrote as its last step began
        self._replay: RunState | None = None
        #: a checkpoint whose workers may still be writing (see save_checkpoint)
        self._pending_save: PendingSave | None = None
        #: the generation pipeline of an asynchronous run (async_staleness > 0)
        self._async: AsyncRollout | None = None
        #: the engine servers that generate (rollout_engine builtin or vllm), with partial
        #: rollout when async_staleness > 0
        self._servers: ServerRollout | None = None
        #: the agent sessions of the tool task, on those servers
        self._agents: AgentRollout | None = None

    def _init_models(self) -> None:
        """Every role's ``init_model`` (idempotent: a rank that has its model keeps it)."""
        self.actor_rollout_wg.init_model()
        if self.use_critic:
            self.critic_wg.init_model()
        if self.rollout_wg is not None:
            self.rollout_wg.init_model()

    def _workers(self, attribute: str) -> TrainerGroups:
        if self._groups is None:
            raise TrainerStateError(
                f"RayPPOTrainer.{attribute}: no worker groups; call init_workers first (and "
                "not after close)"
            )
        return self._groups

    @property
    def actor_rollout_wg(self) -> WorkerGroup[ActorRolloutRefWorker]:
        """The actor/rollout/reference group (after :meth:`init_workers`)."""
        return self._workers("actor_rollout_wg").actor_rollout

    @property
    def ref_policy_wg(self) -> WorkerGroup[ActorRolloutRefWorker]:
        """The reference policy's group: the actor's, the reference lives in its process."""
        return self._workers("ref_policy_wg").actor_rollout

    @property
    def critic_wg(self) -> WorkerGroup[CriticWorker]:
        """The critic's group (PPO only, after :meth:`init_workers`)."""
        critic = self._workers("critic_wg").critic
        if critic is None:
            raise TrainerStateError(
                "RayPPOTrainer.critic_wg: role_worker_mapping has no Role.Critic (algorithm "
                f"{self.config.algorithm!r} runs no critic)"
            )
        return critic

    @property
    def rollout_wg(self) -> WorkerGroup[RolloutWorker] | None:
        """The separately placed rollout group (``placement="separate"``), else None: the
        actor's group samples."""
        return self._workers("rollout_wg").rollout

    def _sync_weights(self, metrics: dict[str, Any], actor_version: int) -> None:
        """Bring a separately placed rollout to the actor's current weights (those of
        ``actor_version``, its number of updates), after the generation in flight; or push
        them to the engine servers."""
        if self._servers is not None:
            # its time is the step's timing/sync_weights
            self._servers.push_weights(self.actor_rollout_wg, actor_version)
            metrics["sync/weight_version"] = actor_version
        if self._weight_sync is not None:
            if self._async is not None:
                self._async.drain()  # the rollout ends its generation before it takes weights
            version = self._weight_sync.sync()
            metrics["sync/weight_version"] = version
            if self._async is not None:
                self._async.synced(version, actor_version)

    def _driver_phase(self, step: int, phase: str) -> contextlib.AbstractContextManager[None]:
        """Phase ``phase`` of step ``step``, inside which an injected driver fault kills
        this driver (``_driver_faults.py``)."""
        return self._driver_faults.phase(step, phase)
