"""The roles of the RL dataflow: their worker configurations, classes and worker groups.

:func:`worker_configs` turns the trainer's configuration into the sc-workers configuration
of each role; :func:`role_classes` checks the role → worker class mapping a caller gives;
:func:`build_worker_groups` creates the resource pools and one typed worker group per role.
Roles mapped to the same pool run in one process per rank: their classes are colocated into
one worker class, and :meth:`~sc_core.WorkerGroup.spawn` gives one group per role over the
same workers. A spawned group is typed as the colocated class (``WorkerGroup[Worker]``);
:func:`role_group` checks at run time that it binds every registered method of the role's
own class before the checker is told so.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, cast

from sc_core import ClassWithInitArgs, ResourcePoolManager, Worker, WorkerGroup
from sc_dispatch.ext import get_register_attrs
from sc_workers import (
    ActorConfig,
    ActorRolloutRefConfig,
    ActorRolloutRefWorker,
    CriticConfig,
    CriticWorker,
    MegatronConfig,
    ModelConfig,
    OptimConfig,
    RefConfig,
    RolloutConfig,
    RolloutWorker,
    hf_model_config,
)

from .._errors import TrainerConfigError, TrainerStateError
from ..config import TrainerConfig
from ..tasks import DigitsTask, Task
from ._launcher import Launcher

__all__ = [
    "Role",
    "RoleClasses",
    "TrainerGroups",
    "build_worker_groups",
    "model_config",
    "registered_method_names",
    "role_classes",
    "role_group",
    "worker_configs",
]

W = TypeVar("W")

#: The prefix of each role's methods in a colocated worker class (verl's names).
ACTOR_ROLLOUT = "actor_rollout"
CRITIC = "critic"


class Role(enum.Enum):
    """The roles of the RL dataflow that this trainer places (verl's names)."""

    ActorRolloutRef = "actor_rollout_ref"
    Critic = "critic"
    Rollout = "rollout"


def model_config(config: TrainerConfig, task: Task) -> ModelConfig:
    """The model of every role: the Hugging Face directory ``config.model_path`` (its
    architecture and token ids), or the built-in transformer sized by ``config`` for
    ``task``'s tokenizer and sequence length."""
    if config.model_path is not None:
        return hf_model_config(config.model_path, seed=config.seed)
    if not isinstance(task, DigitsTask):
        raise TrainerConfigError(
            "model_config: an agent task runs on engine servers, with a Hugging Face model "
            "(model_path)"
        )
    tok = task.tokenizer
    return ModelConfig(
        vocab_size=tok.vocab_size,
        hidden_size=config.hidden_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        intermediate_size=4 * config.hidden_size,
        max_position_embeddings=task.prompt_length + task.response_length,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
        seed=config.seed,
        absolute_position_embeddings=config.uses_absolute_positions,
    )


def _micro_batch(rows: int, pp: int) -> int:
    """Micro-batch rows for a rank's ``rows``: all of them (the tiny model needs no
    accumulation), or with pipeline stages 4 x pp micro-batches (else 2 x pp, else pp),
    so that a schedule has micro-batches to overlap."""
    if pp == 1:
        return rows
    for count in (4 * pp, 2 * pp, pp):
        if rows % count == 0:
            return rows // count
    return rows


def worker_configs(config: TrainerConfig, task: Task) -> tuple[ActorRolloutRefConfig, CriticConfig]:
    """The sc-workers configuration of the actor/rollout/ref and critic workers.

    The actor and reference model run ``actor_pp`` pipeline stages on the megatron-style
    engine, or Ulysses over ``sp`` ranks on FSDP; the critic runs FSDP (with Ulysses over
    ``sp``). Each role's dp size is what its model parallelism leaves of the workers.
    """
    model = model_config(config, task)
    n = config.responses_per_prompt
    pp, sp = config.actor_pp, config.sp
    actor_dp = config.workers_per_role // (pp * sp)
    critic_dp = config.workers_per_role // sp
    mini_prompts = config.prompts_per_step // config.ppo_mini_batches
    micro = _micro_batch(mini_prompts * n // actor_dp, pp)
    rows_per_rank = _micro_batch(config.rows_per_step // actor_dp, pp)
    critic_micro = mini_prompts * n // critic_dp
    critic_rows = config.rows_per_step // critic_dp
    strategy: Literal["fsdp", "megatron"] = "megatron" if pp > 1 else "fsdp"
    megatron = MegatronConfig(pipeline_model_parallel_size=pp)
    actor_rollout_ref = ActorRolloutRefConfig(
        model=model,
        actor=ActorConfig(
            ppo_mini_batch_size=mini_prompts,
            ppo_micro_batch_size_per_gpu=micro,
            ppo_epochs=config.ppo_epochs,
            clip_ratio=config.clip_ratio,
            entropy_coeff=config.entropy_coeff,
            use_kl_loss=config.kl_coef > 0,
            kl_loss_coef=config.kl_coef,
            kl_loss_type="low_var_kl",
            data_loader_seed=config.seed,
            optim=OptimConfig(lr=config.actor_lr, weight_decay=0.0),
            megatron=megatron,
            strategy=strategy,
            ulysses_sequence_parallel_size=sp,
        ),
        rollout=RolloutConfig(
            temperature=config.temperature,
            response_length=task.response_length,
            n=n,
            log_prob_micro_batch_size_per_gpu=rows_per_rank,
            seed=config.seed,
            tensor_model_parallel_size=config.rollout_tp,
            exact_window=config.exact_window,
        ),
        ref=RefConfig(
            log_prob_micro_batch_size_per_gpu=rows_per_rank,
            strategy=strategy,
            megatron=megatron,
            ulysses_sequence_parallel_size=sp,
        ),
        device=config.device,
    )
    critic = CriticConfig(
        model=model,
        ppo_mini_batch_size=mini_prompts,
        ppo_micro_batch_size_per_gpu=critic_micro,
        forward_micro_batch_size_per_gpu=critic_rows,
        ppo_epochs=config.ppo_epochs,
        rollout_n=n,
        data_loader_seed=config.seed,
        optim=OptimConfig(lr=config.critic_lr, weight_decay=0.0),
        device=config.device,
        ulysses_sequence_parallel_size=sp,
    )
    return actor_rollout_ref, critic


@dataclass(frozen=True)
class RoleClasses:
    """The worker class of each role: the actor's always, the critic's for PPO, the
    rollout's when sampling runs on a group of its own."""

    actor_rollout_ref: type[ActorRolloutRefWorker]
    critic: type[CriticWorker] | None
    rollout: type[RolloutWorker] | None = None


def role_classes(mapping: Mapping[Role, type]) -> RoleClasses:
    """Check a role → worker class mapping: ``Role.ActorRolloutRef`` must map to (a subclass
    of) ``ActorRolloutRefWorker``, ``Role.Critic``, if present, to ``CriticWorker``."""
    unknown = [role for role in mapping if not isinstance(role, Role)]
    if unknown:
        raise TrainerConfigError(
            f"RayPPOTrainer: role_worker_mapping has keys {unknown!r} that are no Role "
            f"(roles: {[r.name for r in Role]})"
        )
    if Role.ActorRolloutRef not in mapping:
        raise TrainerConfigError(
            f"RayPPOTrainer: role_worker_mapping needs Role.ActorRolloutRef, got roles "
            f"{[r.name for r in mapping]}"
        )
    actor = _subclass(mapping[Role.ActorRolloutRef], ActorRolloutRefWorker, Role.ActorRolloutRef)
    critic_cls = mapping.get(Role.Critic)
    critic = None if critic_cls is None else _subclass(critic_cls, CriticWorker, Role.Critic)
    rollout_cls = mapping.get(Role.Rollout)
    rollout = None if rollout_cls is None else _subclass(rollout_cls, RolloutWorker, Role.Rollout)
    return RoleClasses(actor, critic, rollout)


def _subclass(cls: object, base: type[W], role: Role) -> type[W]:
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TrainerConfigError(
            f"RayPPOTrainer: role_worker_mapping[Role.{role.name}] must be {base.__name__} or "
            f"a subclass, got {cls!r}"
        )
    return cls


def registered_method_names(cls: type) -> list[str]:
    """The names of the ``@register``-ed methods of ``cls`` (inherited ones included)."""
    names = []
    for name in dir(cls):
        try:
            attr = getattr(cls, name)
        except AttributeError:
            continue
        if callable(attr) and get_register_attrs(attr) is not None:
            names.append(name)
    return sorted(names)


def role_group(
    groups: Mapping[str, WorkerGroup[Worker]], role: str, cls_with_init: ClassWithInitArgs[W]
) -> WorkerGroup[W]:
    """The group that :meth:`~sc_core.WorkerGroup.spawn` made for ``role``, typed as a
    group of the role's own class (``cls_with_init``, the class the role was colocated
    from): a checked cast. The group must bind every registered method of that class under
    its plain name, else :class:`TrainerStateError`."""
    group = groups.get(role)
    if group is None:
        raise TrainerStateError(
            f"RayPPOTrainer.init_workers: spawn made no group for role {role!r} "
            f"(made: {sorted(groups)})"
        )
    # sc-ray's class with init args names the class behind a ray.remote wrapper (its
    # public ``worker_cls``); sc-core's holds the plain class the launcher gave it
    worker_cls = getattr(cls_with_init, "worker_cls", cls_with_init.cls)
    if not isinstance(worker_cls, type):
        raise TrainerStateError(
            f"RayPPOTrainer.init_workers: role {role!r} was built from {worker_cls!r}, "
            "which is not a class"
        )
    bound = set(group.bound_method_names)
    missing = [name for name in registered_method_names(worker_cls) if name not in bound]
    if missing:
        raise TrainerStateError(
            f"RayPPOTrainer.init_workers: the group spawned for role {role!r} does not bind "
            f"{missing} of {worker_cls.__qualname__} (bound: {sorted(bound)})"
        )
    return cast("WorkerGroup[W]", group)


@dataclass(frozen=True)
class TrainerGroups:
    """The worker group of each role, and the groups that own the workers (to close)."""

    actor_rollout: WorkerGroup[ActorRolloutRefWorker]
    critic: WorkerGroup[CriticWorker] | None
    owned: tuple[WorkerGroup[Any], ...]
    rollout: WorkerGroup[RolloutWorker] | None = None

    def init_models(self) -> None:
        """Every role's ``init_model`` (idempotent: a rank that has its model keeps it)."""
        self.actor_rollout.init_model()
        if self.critic is not None:
            self.critic.init_model()
        if self.rollout is not None:
            self.rollout.init_model()

    def any_dead(self) -> bool:
        """Whether a worker of an owned group is known dead."""
        return any(group.dead_ranks for group in self.owned)

    def every_group(self) -> list[WorkerGroup[Any]]:
        """Every group object, the role groups (spawned views) and their owners, once each."""
        found: list[WorkerGroup[Any]] = []
        for group in (self.actor_rollout, self.critic, self.rollout, *self.owned):
            if group is not None and not any(group is g for g in found):
                found.append(group)
        return found


def build_worker_groups(
    launcher: Launcher,
    manager: ResourcePoolManager,
    classes: RoleClasses,
    actor_config: ActorRolloutRefConfig,
    critic_config: CriticConfig,
) -> TrainerGroups:
    """Create the pools of ``manager``, then one worker group per role with ``launcher``.

    The actor, its rollout and the reference model are one worker (role
    ``actor_rollout_ref``), so they share a process per rank. A critic mapped to the same
    pool is colocated with them (one class, :meth:`~sc_core.WorkerGroup.spawn` per role);
    one in a pool of its own gets a group of its own. A separately placed rollout
    (``Role.Rollout``) gets a group of its own in its pool.
    """
    manager.create_resource_pool()
    groups = _training_groups(launcher, manager, classes, actor_config, critic_config)
    if classes.rollout is None:
        return groups
    try:
        rollout_cls = launcher.class_with_init(classes.rollout, config=actor_config)
        rollout = launcher.worker_group(
            manager.get_resource_pool(Role.Rollout), rollout_cls, name=Role.Rollout.value
        )
    except BaseException:
        for group in groups.owned:
            group.close()
        raise
    return TrainerGroups(
        groups.actor_rollout, groups.critic, (*groups.owned, rollout), rollout=rollout
    )


def _training_groups(
    launcher: Launcher,
    manager: ResourcePoolManager,
    classes: RoleClasses,
    actor_config: ActorRolloutRefConfig,
    critic_config: CriticConfig,
) -> TrainerGroups:
    actor_pool = manager.get_resource_pool(Role.ActorRolloutRef)
    actor_cls = launcher.class_with_init(
        classes.actor_rollout_ref, config=actor_config, role=Role.ActorRolloutRef.value
    )
    if classes.critic is None:
        actor = launcher.worker_group(actor_pool, actor_cls, name=Role.ActorRolloutRef.value)
        return TrainerGroups(actor, None, (actor,))
    critic_pool = manager.get_resource_pool(Role.Critic)
    critic_cls = launcher.class_with_init(classes.critic, config=critic_config)
    if critic_pool is not actor_pool:
        actor = launcher.worker_group(actor_pool, actor_cls, name=Role.ActorRolloutRef.value)
        owned: list[WorkerGroup[Any]] = [actor]
        try:
            critic = launcher.worker_group(critic_pool, critic_cls, name=Role.Critic.value)
        except BaseException:
            actor.close()
            raise
        owned.append(critic)
        return TrainerGroups(actor, critic, tuple(owned))
    class_dict: dict[str, ClassWithInitArgs[Any]] = {ACTOR_ROLLOUT: actor_cls, CRITIC: critic_cls}
    colocated = launcher.worker_group(
        actor_pool, launcher.create_colocated_worker_cls(class_dict), name="actor_critic"
    )
    try:
        spawned = colocated.spawn(prefix_set=class_dict.keys())
        return TrainerGroups(
            role_group(spawned, ACTOR_ROLLOUT, actor_cls),
            role_group(spawned, CRITIC, critic_cls),
            (colocated,),
        )
    except BaseException:
        colocated.close()
        raise
