"""The trainer's configuration: typed dataclasses, validated when built."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ._errors import TrainerConfigError
from ._faults import FaultSpec
from ._options import option
from ._run_config import RunConfig, check_detached
from ._task import TaskConfig

__all__ = [
    "ALGORITHMS",
    "BACKENDS",
    "DEVICES",
    "PLACEMENTS",
    "Algorithm",
    "Backend",
    "Device",
    "Placement",
    "TrainerConfig",
]

Algorithm = Literal["ppo", "grpo"]
Backend = Literal["ray", "local"]
Device = Literal["cpu", "cuda"]
Placement = Literal["colocated", "separate"]
#: who generates: the actor's or the rollout's worker group, or engine servers behind a router
RolloutEngineName = Literal["workers", "builtin", "vllm"]
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
PLACEMENTS: tuple[Placement, ...] = get_args(Placement)
ROLLOUT_ENGINES: tuple[RolloutEngineName, ...] = get_args(RolloutEngineName)
#: sc-demo's steps for the tiny GPT-2 a server rollout trains when no model is given (PPO
#: reached 0.89-1.0 by step 200 depending on the seed, against step 75 for the built-in model)
SERVER_MODEL_STEPS = 300
#: sc-demo's learning rates for the tool task: at 2e-3 its policy reached 0.82 and then
#: collapsed once it called the tool; at 1e-3 it reaches 1.0 at step 175 and stays between
#: 0.78 and 1.0 (trainer guide)
TOOL_CALC_LR = 1e-3
BACKENDS: tuple[Backend, ...] = get_args(Backend)
DEVICES: tuple[Device, ...] = get_args(Device)


def _rollout_engine_given(given: Mapping[str, Any]) -> str:
    """The rollout engine the parsed flags ``given`` ask for: ``--rollout``, else builtin for
    the tool task (its agent sessions run on servers), else workers."""
    engine = given.get("rollout_engine")
    if isinstance(engine, str):
        return engine
    return "builtin" if given.get("task_mode") == "tool-calc" else "workers"


def _tool_calc_lr(given: Mapping[str, Any]) -> float | None:
    """The learning rate the tool task's flags default to (``None``: the field's)."""
    return TOOL_CALC_LR if given.get("task_mode") == "tool-calc" else None


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
class TrainerConfig:
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

    algorithm: Algorithm = field(
        default="ppo",
        metadata=option(
            group="run", help="ppo (actor + critic, GAE) or grpo (group-normalised rewards)"
        ),
    )
    backend: Backend = field(
        default="ray",
        metadata=option(
            group="run",
            help="ray: a local Ray cluster started for the run; local: everything in this process "
            "(world size 1 per role)",
        ),
    )
    steps: int = field(
        default=200,
        metadata=option(
            group="run",
            help="total training steps, counting those a resumed run starts from",
            default_text="200; 300 for the tiny GPT-2 of --rollout builtin or vllm, which learns "
            "the task more slowly than the built-in model",
            derive=lambda given: (
                SERVER_MODEL_STEPS
                if _rollout_engine_given(given) != "workers" and given.get("model_path") is None
                else None
            ),
        ),
    )
    prompts_per_step: int = field(
        default=32, metadata=option(group="training", help="prompts per step")
    )
    responses_per_prompt: int = field(
        default=4,
        metadata=option(group="training", help="samples per prompt (the GRPO group size)"),
    )
    workers_per_role: int = field(
        default=2,
        metadata=option(
            group="run",
            flags=("--workers-per-role", "--n-workers"),
            help="data-parallel workers per role",
            default_text="2 on ray, 1 on local",
            derive=lambda given: 1 if given["backend"] == "local" else None,
        ),
    )
    nnodes: int = 1
    colocate: bool = field(
        default=True,
        metadata=option(
            group="run",
            help="run the critic in the actor/rollout/ref processes, or in a resource pool of its "
            "own",
            default_text="colocated",
        ),
    )
    placement: Placement = field(
        default="colocated",
        metadata=option(
            group="run",
            help="colocated: sample with the actor's model in its processes; separate: sample on a "
            "rollout group of its own, whose weights follow the actor's by a weight sync after "
            "every update",
            default_text="colocated; separate with --async-staleness above 0",
            derive=lambda given: (
                "separate"
                if given["async_staleness"] > 0 and _rollout_engine_given(given) == "workers"
                else None
            ),
        ),
    )
    rollout_tp: int = field(
        default=1,
        metadata=option(group="run", help="tensor-parallel size of a separately placed rollout"),
    )
    actor_pp: int = field(
        default=1,
        metadata=option(
            group="run",
            metavar="N",
            help="pipeline stages of the actor and reference model (the megatron-style engine, "
            "split by decoder layers); their dp size is workers_per_role / N",
        ),
    )
    sp: int = field(
        default=1,
        metadata=option(
            group="run",
            metavar="N",
            help="Ulysses sequence parallelism of the actor, reference and critic (FSDP): each "
            "sequence split over N ranks; the dp size is workers_per_role / N",
        ),
    )
    rollout_engine: RolloutEngineName = field(
        default="workers",
        metadata=option(
            group="run",
            flags=("--rollout",),
            default_text="workers; builtin with --task tool-calc",
            derive=lambda given: _rollout_engine_given(given),
            help="workers: sample on worker groups (the actor's, or the rollout's with --placement "
            "separate); builtin or vllm: on engine servers (sc-workers' engine, or vLLM from its "
            "own environment: python -m sc_rollout vllm-env create) behind a router, fed the "
            "actor's weights after every update; a Hugging Face model (--model), or a tiny GPT-2 "
            "built in the output folder",
        ),
    )
    agent_extra_groups: int = field(
        default=0,
        metadata=option(
            group="run",
            metavar="N",
            help="agent tasks (tool-calc): keep N more prompt groups running than a step needs, "
            "and train on the first groups to finish (streaming), so that slow agents do not "
            "hold the batch; 0: wait for every session",
        ),
    )
    agent_deadline_s: float = field(
        default=120.0,
        metadata=option(
            group="run",
            metavar="S",
            help="agent tasks: a session running longer is dropped (recorded, masked out)",
        ),
    )
    rollout_servers: int = field(
        default=1,
        metadata=option(group="run", help="engine servers of --rollout builtin or vllm"),
    )
    async_staleness: int = field(
        default=0,
        metadata=option(
            group="run",
            metavar="K",
            help="generate the next batch on a separately placed rollout (implies --placement "
            "separate) while the actor trains on this one, from weights at most K updates old, "
            "the PPO ratio against the sampling policy; with --rollout builtin or vllm, partial "
            "rollout: the servers take each update's weights mid-generation; 0: synchronous",
        ),
    )
    seed: int = field(
        default=0,
        metadata=option(
            group="run", help="seed of the prompts, the model initialisation and sampling"
        ),
    )
    # policy and critic optimisation
    actor_lr: float = field(
        default=2e-3,
        metadata=option(
            group="training",
            help="actor learning rate",
            default_text=f"2e-3; {TOOL_CALC_LR:g} with --task tool-calc",
            derive=lambda given: _tool_calc_lr(given),
        ),
    )
    critic_lr: float = field(
        default=2e-3,
        metadata=option(
            group="training",
            help="critic learning rate",
            default_text=f"2e-3; {TOOL_CALC_LR:g} with --task tool-calc",
            derive=lambda given: _tool_calc_lr(given),
        ),
    )
    ppo_epochs: int = field(
        default=1, metadata=option(group="training", help="passes over each batch per update")
    )
    ppo_mini_batches: int = field(
        default=1, metadata=option(group="training", help="optimizer steps per pass")
    )
    clip_ratio: float = 0.2
    entropy_coeff: float = field(
        default=0.01, metadata=option(group="training", help="weight of the actor's entropy bonus")
    )
    kl_coef: float = field(
        default=0.001,
        metadata=option(group="training", help="weight of the actor's KL-to-reference loss"),
    )
    gamma: float = 1.0
    lam: float = 1.0
    temperature: float = 1.0
    # model: the built-in tiny causal transformer of sc-workers, or a local Hugging Face
    # causal-LM directory (model_path; its config then sets the shape, not the three below)
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    absolute_positions: bool | None = field(
        default=None,
        metadata=option(
            group="training",
            help="give the built-in model learned absolute position embeddings besides its rotary "
            "ones; without them it does not learn to reverse the digits",
            default_text="on, except with --model",
        ),
    )
    model_path: str | None = field(
        default=None,
        metadata=option(
            group="training",
            flags=("--model",),
            metavar="PATH",
            help="train the local Hugging Face causal-LM directory PATH (config, weights, "
            "tokenizer) on the task as text, instead of the built-in model (needs sc-workers[hf])",
            default_text="",
        ),
    )
    device: Device = field(
        default="cpu",
        metadata=option(
            group="training",
            help="where the workers compute; cuda gives each worker process one GPU",
        ),
    )
    # bookkeeping
    val_every: int = field(
        default=25,
        metadata=option(
            group="training", help="validate every N steps, before the first and after the last"
        ),
    )
    save_every: int = field(
        default=50,
        metadata=option(group="training", help="checkpoint every N steps, and after the last"),
    )
    # checkpoints: written by the workers in the background of the next steps (the step
    # pays for a copy in memory, not for the disk), and only the newest keep_checkpoints kept
    background_checkpoints: bool = True
    keep_checkpoints: int = 3
    output_dir: str = field(
        default="sc-demo-output",
        metadata=option(group="run", metavar="DIR", help="where the run writes"),
    )
    resume_from: str | None = field(
        default=None,
        metadata=option(
            group="run",
            metavar="PATH",
            help="continue from a checkpoint folder, or from an output folder's newest checkpoint",
            default_text="",
        ),
    )
    # fault tolerance: faults to inject ("actor:1@step=30", "critic:0@step=3:update_critic+0.2",
    # comma-separated; see _faults.py), and how many deaths one run recovers from in place
    inject_fault: str | None = field(
        default=None,
        metadata=option(
            group="fault tolerance",
            metavar="ROLE:RANK@step=N[:METHOD[+S]][:raise]",
            help="kill rank RANK of ROLE's group (actor, critic or rollout) when step N begins, "
            "to watch the run recover in place, e.g. actor:1@step=30; with METHOD, kill it S "
            "seconds into that method from step N on (or make the method raise, which ends the "
            "run); several faults are separated by commas",
            default_text="no fault",
        ),
    )
    max_recoveries: int = field(
        default=3,
        metadata=option(group="fault tolerance", help="worker deaths one run recovers from"),
    )
    # spare worker processes per worker group (Ray), that take over a dead rank at once
    standby: int = field(
        default=0,
        metadata=option(
            group="fault tolerance",
            help="spare worker processes per worker group (ray), started up front, that take "
            "over a dead rank without a process start-up",
        ),
    )
    num_cpus: int | None = field(
        default=None,
        metadata=option(
            group="run",
            help="CPUs the local Ray cluster declares",
            default_text="enough for the workers",
        ),
    )
    task: TaskConfig = field(default_factory=TaskConfig)
    #: a detached run on a standing Ray cluster, that a new driver can re-attach to
    run: RunConfig = field(default_factory=RunConfig)

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
            if self.async_staleness > 0 and self.temperature != 1.0:
                raise TrainerConfigError(
                    f"{owner}: rollout_engine={self.rollout_engine!r} with async_staleness="
                    f"{self.async_staleness} trains on the engines' log-probs, which are taken "
                    f"before temperature; temperature must be 1.0, got {self.temperature}"
                )
            if self.backend != "ray":
                raise TrainerConfigError(
                    f"{owner}: rollout_engine={self.rollout_engine!r} places its servers with "
                    f"Ray; it needs backend='ray', got {self.backend!r}"
                )
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
        _positive(
            owner,
            steps=self.steps,
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
            if fault.rank >= self.workers_per_role:
                raise TrainerConfigError(
                    f"{owner}.inject_fault={self.inject_fault!r}: rank {fault.rank} is outside "
                    f"the {self.workers_per_role} workers of a role"
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
        train_prompts = 10**self.task.length - self.task.num_val
        if self.prompts_per_step > train_prompts:
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

    def _check_agent_task(self, owner: str) -> None:
        """The tool task runs agent sessions on engine servers, synchronously or with a
        staleness bound of its own (not on worker groups)."""
        if self.rollout_engine == "workers":
            raise TrainerConfigError(
                f"{owner}: task mode 'tool-calc' runs multi-turn agent sessions on engine "
                "servers; rollout_engine must be 'builtin' or 'vllm', got 'workers'"
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
