"""The trainer's configuration fields: each with its default and its ``sc-demo`` option.

:class:`TrainerFields` declares them; :class:`~sc_trainer.TrainerConfig` (``_trainer.py``)
is the class users build, which adds the checks that run when it is built and the values
derived from the fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from ._options import option
from ._run import RunConfig
from ._sections import DataConfig, RewardConfig, RolloutCorrectionConfig, TrackingConfig
from ._task import TaskConfig

__all__ = [
    "ALGORITHMS",
    "BACKENDS",
    "DEVICES",
    "PLACEMENTS",
    "ROLLOUT_ENGINES",
    "SERVER_MODEL_STEPS",
    "TOOL_CALC_LR",
    "Algorithm",
    "BackendName",
    "Device",
    "Placement",
    "RESUME_MODES",
    "ResumeMode",
    "RolloutEngineName",
    "TrainerFields",
]

Algorithm = Literal["ppo", "grpo"]
BackendName = Literal["ray", "local"]
Device = Literal["cpu", "cuda"]
Placement = Literal["colocated", "separate"]
#: who generates: the actor's or the rollout's worker group, or engine servers behind a router
RolloutEngineName = Literal["workers", "builtin", "vllm"]
#: whether a run continues from its output folder's newest checkpoint by itself
ResumeMode = Literal["disable", "auto"]
RESUME_MODES: tuple[ResumeMode, ...] = get_args(ResumeMode)
ALGORITHMS: tuple[Algorithm, ...] = get_args(Algorithm)
PLACEMENTS: tuple[Placement, ...] = get_args(Placement)
ROLLOUT_ENGINES: tuple[RolloutEngineName, ...] = get_args(RolloutEngineName)
#: sc-demo's steps for the tiny GPT-2 a server rollout trains when no model is given (PPO
#: reached 0.89-1.0 by step 200 depending on the seed, against step 75 for the built-in model)
SERVER_MODEL_STEPS = 300
#: sc-demo's learning rates for the tool task: at 2e-3 its policy reached 0.82 and then
#: collapsed once it called the tool; at 1e-3 it holds 1.0 over steps 200-300 for three seeds
#: (trainer guide)
TOOL_CALC_LR = 1e-3
BACKENDS: tuple[BackendName, ...] = get_args(BackendName)
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


@dataclass
class TrainerFields:
    """The fields of :class:`~sc_trainer.TrainerConfig` (documented there)."""

    algorithm: Algorithm = field(
        default="ppo",
        metadata=option(
            group="run", help="ppo (actor + critic, GAE) or grpo (group-normalised rewards)"
        ),
    )
    backend: BackendName = field(
        default="ray",
        metadata=option(
            group="run",
            help="ray: a local Ray cluster started for the run; local: everything in this process "
            "(world size 1 per role)",
        ),
    )
    steps: int | None = field(
        default=200,
        metadata=option(
            group="run",
            help="total training steps, counting those a resumed run starts from (a dataset "
            "run without steps trains data.total_epochs epochs)",
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
    # "node@step=3:update_actor+0.5", comma-separated; see sc_trainer.faults), and how many
    # deaths one run recovers from in place
    inject_fault: str | None = field(
        default=None,
        metadata=option(
            group="fault tolerance",
            metavar="ROLE:RANK@step=N[:METHOD[+S]][:raise]",
            help="kill rank RANK of ROLE's group (actor, critic or rollout) when step N begins, "
            "to watch the run recover in place, e.g. actor:1@step=30; with METHOD, kill it S "
            "seconds into that method from step N on (or make the method raise, which ends the "
            "run); server:I@step=N kills engine server I (--rollout builtin or vllm), which the "
            "router restarts; reward:P@step=N[:raise|hang] makes the reward call of row P of step "
            "N's batch fail (a dataset run); node@step=N[:PHASE[+S]] loses a whole node (backend "
            "ray): the node of the highest actor rank not on the driver's node, or of actor rank "
            "RANK with node:RANK@...; several faults are separated by commas",
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
    #: also write the actor as a Hugging Face folder (``huggingface/``) into each checkpoint
    save_hf: bool = False
    #: ``"auto"``: continue from the output folder's newest checkpoint when it has one (no
    #: ``resume_from`` needed); ``"disable"``: start afresh unless ``resume_from`` is given
    resume_mode: ResumeMode = "disable"
    task: TaskConfig = field(default_factory=TaskConfig)
    #: the user's dataset (none: the built-in ``task``), its reward function, the trackers
    data: DataConfig = field(default_factory=DataConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    #: a detached run on a standing Ray cluster, that a new driver can re-attach to
    run: RunConfig = field(default_factory=RunConfig)
    #: corrections for the sampler-trainer mismatch (verl's algorithm.rollout_correction)
    rollout_correction: RolloutCorrectionConfig = field(default_factory=RolloutCorrectionConfig)
    #: the exact mode (the trainer guide): each sequence alone in an N-token window; 0: off
    exact_window: int = field(
        default=0,
        metadata=option(
            group="training",
            metavar="N",
            help="the exact mode: sampling and the actor's log-probs run each sequence alone in "
            "an N-token window, so they agree bit for bit and the first PPO ratio of each step "
            "is exactly 1 (slower; worker groups or --rollout builtin); 0: off",
        ),
    )
    exact_check: bool = field(
        default=False,
        metadata=option(
            group="training",
            help="with --exact-window: stop the run at the first response token whose sampled "
            "log-prob differs from the actor's, naming it",
        ),
    )
