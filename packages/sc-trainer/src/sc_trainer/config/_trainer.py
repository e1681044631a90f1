"""The trainer's configuration: typed dataclasses, validated when built.

The fields, with their defaults and ``sc-demo`` options, are declared in
``_fields.py``; :class:`TrainerConfig` adds the checks and the derived values.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .._errors import TrainerConfigError
from ..faults import FaultSpec, NodeFault, RewardFault
from ._fields import (
    ALGORITHMS,
    BACKENDS,
    DEVICES,
    PLACEMENTS,
    RESUME_MODES,
    ROLLOUT_ENGINES,
    TrainerFields,
)
from ._run import check_detached

__all__ = ["TrainerConfig"]


def _positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value > 0:
            raise TrainerConfigError(f"{owner}.{name} must be > 0, got {value!r}")


def _int_at_least(owner: str, name: str, value: object, minimum: int) -> None:
    """``value`` (field ``name``) must be an int (not a bool) of at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TrainerConfigError(f"{owner}.{name} must be an int, got {value!r}")
    if value < minimum:
        raise TrainerConfigError(f"{owner}.{name} must be >= {minimum}, got {value}")


def _non_negative(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not value >= 0:
            raise TrainerConfigError(f"{owner}.{name} must be >= 0, got {value!r}")


@dataclass
class TrainerConfig(TrainerFields):
    """Everything one training run needs; the defaults are the ``sc-demo`` run.

    Rows per step are ``prompts_per_step * responses_per_prompt``; every dp size divides it.
    ``responses_per_prompt`` is the GRPO group size (PPO may sample several too).

    ``absolute_positions`` gives the built-in model learned absolute position embeddings
    (``None``: on for the built-in model; a Hugging Face model brings its own position
    encoding, so ``True`` with ``model_path`` is an error). ``model_path`` trains the local
    Hugging Face causal LM in that directory on the task as text, through its own
    tokenizer. ``device`` is where the workers compute (``"cuda"``: one GPU per worker).

    ``placement="separate"`` samples on a rollout group of its own (``workers_per_role``
    processes, tensor parallel over ``rollout_tp`` of them, replicas over the rest) whose
    weights follow the actor's through a weight sync after every update; ``"colocated"``
    (the default) samples with the actor's own model in the actor's processes.

    ``async_staleness`` (k) > 0 makes a separately placed rollout generate the next batch
    while the actor trains on the current one: a batch that trains the actor from version v
    to v + 1 was sampled with the weights of version v - k or newer, and the PPO ratio uses
    the sampling-time log-probs (see docs/guides/async-training.md). 0: the synchronous loop.
    """

    def __post_init__(self) -> None:
        owner = "TrainerConfig"
        if self.algorithm not in ALGORITHMS:
            raise TrainerConfigError(
                f"{owner}.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}"
            )
        if self.placement not in PLACEMENTS:
            raise TrainerConfigError(
                f"{owner}.placement must be one of {PLACEMENTS}, got {self.placement!r}"
            )
        _int_at_least(owner, "rollout_tp", self.rollout_tp, 1)
        if self.rollout_tp > 1 and self.placement != "separate":
            raise TrainerConfigError(
                f"{owner}: rollout_tp={self.rollout_tp} needs placement='separate' (a colocated "
                "rollout samples with the actor's own layout)"
            )
        if self.workers_per_role % self.rollout_tp:
            raise TrainerConfigError(
                f"{owner}: rollout_tp ({self.rollout_tp}) must divide the rollout group's "
                f"{self.workers_per_role} workers (workers_per_role)"
            )
        _int_at_least(owner, "actor_pp", self.actor_pp, 1)
        _int_at_least(owner, "sp", self.sp, 1)
        if self.actor_pp > 1 and self.sp > 1:
            raise TrainerConfigError(
                f"{owner}: actor_pp={self.actor_pp} and sp={self.sp}: the actor runs pipeline "
                "stages on the megatron-style engine and Ulysses on the FSDP engine; pick one"
            )
        if self.backend == "local" and (self.actor_pp > 1 or self.sp > 1):
            raise TrainerConfigError(
                f"{owner}: actor_pp={self.actor_pp}, sp={self.sp} need a process per stage or "
                "sequence shard; the in-process backend (backend='local') runs one rank per "
                "role: use backend='ray'"
            )
        for name, size in (("actor_pp", self.actor_pp), ("sp", self.sp)):
            if self.workers_per_role % size:
                raise TrainerConfigError(
                    f"{owner}: {name} ({size}) must divide workers_per_role "
                    f"({self.workers_per_role})"
                )
        if self.actor_pp > self.num_layers and self.model_path is None:
            raise TrainerConfigError(
                f"{owner}: actor_pp={self.actor_pp} stages need at least as many decoder layers; "
                f"num_layers is {self.num_layers}"
            )
        _int_at_least(owner, "async_staleness", self.async_staleness, 0)
        if (
            self.async_staleness > 0
            and self.placement != "separate"
            and self.rollout_engine == "workers"
        ):
            raise TrainerConfigError(
                f"{owner}: async_staleness={self.async_staleness} needs placement='separate' "
                f"(got {self.placement!r}): generation overlaps the update only on a rollout "
                "group of its own"
            )
        if self.rollout_engine not in ROLLOUT_ENGINES:
            raise TrainerConfigError(
                f"{owner}.rollout_engine must be one of {ROLLOUT_ENGINES}, "
                f"got {self.rollout_engine!r}"
            )
        _int_at_least(owner, "rollout_servers", self.rollout_servers, 1)
        if self.rollout_engine != "workers":
            if self.placement != "colocated":
                raise TrainerConfigError(
                    f"{owner}: rollout_engine={self.rollout_engine!r} generates on servers of "
                    f"its own; placement must stay 'colocated' (got {self.placement!r})"
                )
            if self.backend != "ray":
                raise TrainerConfigError(
                    f"{owner}: rollout_engine={self.rollout_engine!r} places its servers with "
                    f"Ray; it needs backend='ray', got {self.backend!r}"
                )
        self._check_exact_mode(owner)
        if self.device not in DEVICES:
            raise TrainerConfigError(
                f"{owner}.device must be one of {DEVICES}, got {self.device!r}"
            )
        if self.absolute_positions is not None and not isinstance(self.absolute_positions, bool):
            raise TrainerConfigError(
                f"{owner}.absolute_positions must be a bool or None, "
                f"got {self.absolute_positions!r}"
            )
        if self.model_path is not None and self.absolute_positions:
            raise TrainerConfigError(
                f"{owner}: absolute_positions is an option of the built-in model; the Hugging "
                f"Face model at model_path={self.model_path!r} brings its own position encoding"
            )
        if self.model_path is not None and not self.model_path:
            raise TrainerConfigError(f"{owner}.model_path must not be empty")
        if self.backend not in BACKENDS:
            raise TrainerConfigError(
                f"{owner}.backend must be one of {BACKENDS}, got {self.backend!r}"
            )
        if self.steps is None:
            if not self.data.given:
                raise TrainerConfigError(
                    f"{owner}.steps may be None only for a dataset run (data.train_files), "
                    "which then trains data.total_epochs epochs"
                )
        else:
            _positive(owner, steps=self.steps)
        _positive(
            owner,
            prompts_per_step=self.prompts_per_step,
            responses_per_prompt=self.responses_per_prompt,
            workers_per_role=self.workers_per_role,
            nnodes=self.nnodes,
            actor_lr=self.actor_lr,
            critic_lr=self.critic_lr,
            ppo_epochs=self.ppo_epochs,
            ppo_mini_batches=self.ppo_mini_batches,
            clip_ratio=self.clip_ratio,
            temperature=self.temperature,
            hidden_size=self.hidden_size,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            val_every=self.val_every,
            save_every=self.save_every,
        )
        _non_negative(owner, entropy_coeff=self.entropy_coeff, kl_coef=self.kl_coef, seed=self.seed)
        for name in ("gamma", "lam"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                raise TrainerConfigError(f"{owner}.{name} must be in [0, 1], got {value!r}")
        if self.algorithm == "grpo" and self.responses_per_prompt < 2:
            raise TrainerConfigError(
                f"{owner}: grpo compares responses to the same prompt, so responses_per_prompt "
                f"must be >= 2, got {self.responses_per_prompt}"
            )
        if self.hidden_size % self.num_heads:
            raise TrainerConfigError(
                f"{owner}: num_heads ({self.num_heads}) must divide hidden_size "
                f"({self.hidden_size})"
            )
        if self.backend == "local" and (self.workers_per_role, self.nnodes) != (1, 1):
            raise TrainerConfigError(
                f"{owner}: the local backend runs world size 1 per role on one node, got "
                f"workers_per_role={self.workers_per_role}, nnodes={self.nnodes}"
            )
        if isinstance(self.standby, bool) or not isinstance(self.standby, int) or self.standby < 0:
            raise TrainerConfigError(f"{owner}.standby must be an int >= 0, got {self.standby!r}")
        if self.standby and self.backend != "ray":
            raise TrainerConfigError(
                f"{owner}: standby={self.standby} keeps spare worker processes, which the "
                f"{self.backend!r} backend does not have (backend='ray')"
            )
        if not isinstance(self.background_checkpoints, bool):
            raise TrainerConfigError(
                f"{owner}.background_checkpoints must be a bool, got "
                f"{self.background_checkpoints!r}"
            )
        _int_at_least(owner, "keep_checkpoints", self.keep_checkpoints, 1)
        _int_at_least(owner, "max_recoveries", self.max_recoveries, 0)
        for node_fault in self.node_faults:
            if self.backend != "ray":
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: losing a node needs the Ray "
                    f"backend (backend='ray'), not {self.backend!r}"
                )
            if node_fault.rank is not None and node_fault.rank >= self.workers_per_role:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: actor rank {node_fault.rank} "
                    f"is outside the {self.workers_per_role} workers of a role"
                )
        for fault in self.faults:
            if fault.role == "critic" and not self.uses_critic:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: this run has no critic "
                    f"(algorithm {self.algorithm!r})"
                )
            if fault.role == "rollout" and self.placement != "separate":
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: the rollout has a group of "
                    "its own only with placement='separate'"
                )
            if fault.role == "server":
                if self.rollout_engine == "workers":
                    raise TrainerConfigError(
                        f"{owner}.inject_fault={self.inject_fault!r}: a server fault needs engine "
                        "servers (rollout_engine 'builtin' or 'vllm')"
                    )
                if fault.rank >= self.rollout_servers:
                    raise TrainerConfigError(
                        f"{owner}.inject_fault={self.inject_fault!r}: server {fault.rank} is "
                        f"outside the run's {self.rollout_servers} servers (rollout_servers)"
                    )
                continue
            if fault.rank >= self.workers_per_role:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: rank {fault.rank} is outside "
                    f"the {self.workers_per_role} workers of a role"
                )
        for reward_fault in self.reward_faults:
            if not self.data.given:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: a reward fault needs a run "
                    "that scores with a reward function (data.train_files); the built-in "
                    "tasks score in code"
                )
            if reward_fault.position >= self.rows_per_step:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: position "
                    f"{reward_fault.position} is outside a step's {self.rows_per_step} rows "
                    "(prompts_per_step x responses_per_prompt)"
                )
        if self.workers_per_role % self.nnodes:
            raise TrainerConfigError(
                f"{owner}: workers_per_role ({self.workers_per_role}) must split evenly over "
                f"nnodes ({self.nnodes})"
            )
        _int_at_least(owner, "agent_extra_groups", self.agent_extra_groups, 0)
        _positive(owner, agent_deadline_s=self.agent_deadline_s)
        if self.task.mode == "tool-calc":
            self._check_agent_task(owner)
        self._check_own_task(owner)
        train_prompts = 10**self.task.length - self.task.num_val
        if not self.data.given and self.prompts_per_step > train_prompts:
            raise TrainerConfigError(
                f"{owner}.prompts_per_step ({self.prompts_per_step}) exceeds the "
                f"{train_prompts} training prompts of the task"
            )
        rows = self.rows_per_step
        if rows % (self.workers_per_role * self.ppo_mini_batches):
            raise TrainerConfigError(
                f"{owner}: rows per step ({self.prompts_per_step} prompts x "
                f"{self.responses_per_prompt} responses = {rows}) must divide into "
                f"workers_per_role ({self.workers_per_role}) x ppo_mini_batches "
                f"({self.ppo_mini_batches})"
            )
        if self.num_cpus is not None:
            _positive(owner, num_cpus=self.num_cpus)
            if self.num_cpus < self.worker_processes:
                raise TrainerConfigError(
                    f"{owner}: num_cpus ({self.num_cpus}) is below the {self.worker_processes} "
                    f"worker processes the pools need (one CPU each)"
                )
        if not self.output_dir:
            raise TrainerConfigError(f"{owner}.output_dir must not be empty")
        check_detached(
            self.run,
            backend=self.backend,
            rollout_engine=self.rollout_engine,
            standby=self.standby,
            resume_from=self.resume_from,
            inject_fault=self.inject_fault,
        )

    def _check_exact_mode(self, owner: str) -> None:
        """``exact_window`` and ``exact_check`` (the exact mode, see the trainer guide)."""
        window = self.exact_window
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise TrainerConfigError(f"{owner}.exact_window must be an int >= 0, got {window!r}")
        if window and self.rollout_engine == "vllm":
            raise TrainerConfigError(
                f"{owner}: exact_window={window} is a mode of the worker groups' sampler and "
                "the built-in engine (rollout_engine 'workers' or 'builtin'); vLLM has none "
                "here (see the trainer guide for its batch-invariant mode)"
            )
        if not isinstance(self.exact_check, bool):
            raise TrainerConfigError(
                f"{owner}.exact_check must be a bool, got {self.exact_check!r}"
            )
        if self.exact_check and not window:
            raise TrainerConfigError(
                f"{owner}: exact_check stops at the first token whose log-probs differ, which "
                "without the exact mode is nearly every step; set exact_window too"
            )
        if self.exact_check and self.async_staleness > 0:
            raise TrainerConfigError(
                f"{owner}: exact_check compares the sampler's log-probs with the actor's current "
                f"ones; with async_staleness={self.async_staleness} they come from older weights"
            )

    def _check_agent_task(self, owner: str) -> None:
        """The tool task runs agent sessions on engine servers, synchronously or with a
        staleness bound of its own (not on worker groups)."""
        if self.rollout_engine == "workers":
            raise TrainerConfigError(
                f"{owner}: task mode 'tool-calc' runs multi-turn agent sessions on engine "
                "servers; rollout_engine must be 'builtin' or 'vllm', got 'workers'"
            )

    def _check_own_task(self, owner: str) -> None:
        """A dataset run tokenizes its prompts with the model's tokenizer; an export to Hugging
        Face needs a Hugging Face model; ``resume_mode`` is one of its two values."""
        if self.resume_mode not in RESUME_MODES:
            raise TrainerConfigError(
                f"{owner}.resume_mode must be one of {RESUME_MODES}, got {self.resume_mode!r}"
            )
        for name in ("save_hf",):
            if not isinstance(getattr(self, name), bool):
                raise TrainerConfigError(f"{owner}.{name} must be a bool, got {self.save_hf!r}")
        if self.save_hf and self.model_path is None:
            raise TrainerConfigError(
                f"{owner}.save_hf: the built-in model has no Hugging Face form; train a Hugging "
                "Face model (model_path) to export it"
            )
        if not self.data.given:
            return
        if self.model_path is None:
            raise TrainerConfigError(
                f"{owner}: data.train_files={list(self.data.train_files)} is tokenized with the "
                "model's tokenizer; give a Hugging Face model (model_path, the config key "
                "actor_rollout_ref.model.path)"
            )
        if not self.data.val_files:
            raise TrainerConfigError(
                f"{owner}: a dataset run validates on held-out prompts before the first step "
                "and every val_every steps (trainer.test_freq); give data.val_files"
            )
        if self.task.mode == "tool-calc":
            raise TrainerConfigError(
                f"{owner}: task mode 'tool-calc' is a built-in agent task; a run with "
                "data.train_files trains on its dataset instead"
            )

    @property
    def total_steps(self) -> int:
        """The run's steps (``steps``; a dataset run without it resolves it from its data
        first: :meth:`with_steps`)."""
        if self.steps is None:
            raise TrainerConfigError(
                "TrainerConfig.total_steps: steps is None (a dataset run's length in epochs); "
                "resolve it from the data with with_steps(steps_per_epoch)"
            )
        return self.steps

    def with_steps(self, steps_per_epoch: int) -> TrainerConfig:
        """This configuration with ``steps`` resolved from the data: ``data.total_epochs``
        epochs of ``steps_per_epoch`` steps when ``steps`` is None; unchanged otherwise."""
        if self.steps is not None:
            return self
        return dataclasses.replace(self, steps=self.data.total_epochs * steps_per_epoch)

    def with_absolute_paths(self) -> TrainerConfig:
        """This configuration with every path made absolute (relative ones are relative to
        the current directory): the workers, which run elsewhere, read the same files."""

        def absolute(path: str | None) -> str | None:
            return None if path is None else os.path.abspath(os.path.expanduser(path))

        data = dataclasses.replace(
            self.data,
            train_files=tuple(str(absolute(f)) for f in self.data.train_files),
            val_files=tuple(str(absolute(f)) for f in self.data.val_files),
        )
        reward = dataclasses.replace(self.reward, path=absolute(self.reward.path))
        return dataclasses.replace(
            self,
            model_path=absolute(self.model_path),
            output_dir=str(absolute(self.output_dir)),
            resume_from=absolute(self.resume_from),
            data=data,
            reward=reward,
        )

    @property
    def uses_absolute_positions(self) -> bool:
        """Whether the built-in model gets absolute position embeddings (``None``: yes)."""
        return self.model_path is None and self.absolute_positions is not False

    @property
    def faults(self) -> tuple[FaultSpec, ...]:
        """:attr:`inject_fault` parsed (empty: no fault)."""
        if self.inject_fault is None:
            return ()
        return FaultSpec.parse_all(self.inject_fault)

    @property
    def reward_faults(self) -> tuple[RewardFault, ...]:
        """The reward faults of :attr:`inject_fault` (``reward:P@step=N[:raise|hang]``)."""
        return RewardFault.parse_all(self.inject_fault)

    @property
    def node_faults(self) -> tuple[NodeFault, ...]:
        """The ``node@...`` faults of :attr:`inject_fault` (empty: none)."""
        return NodeFault.parse_all(self.inject_fault)

    @property
    def rows_per_step(self) -> int:
        return self.prompts_per_step * self.responses_per_prompt

    @property
    def uses_critic(self) -> bool:
        """PPO learns a value function; GRPO compares responses to the same prompt instead."""
        return self.algorithm == "ppo"

    @property
    def ray_num_cpus(self) -> int:
        """CPUs the demo's local Ray cluster declares: one per worker process, at least.

        The pools reserve one CPU per process; declaring more logical CPUs than the machine
        has is how several single-threaded workers share a small machine.
        """
        if self.num_cpus is not None:
            return self.num_cpus
        return max(self.worker_processes, os.cpu_count() or 1)

    @property
    def worker_processes(self) -> int:
        """Worker processes of the run: one per rank of each pool (the actor's; the critic's
        unless colocated; the rollout's when placed separately), and one per engine server."""
        pools = 1 + (not self.colocate and self.uses_critic) + (self.placement == "separate")
        servers = self.rollout_servers if self.rollout_engine != "workers" else 0
        return self.workers_per_role * pools + servers
