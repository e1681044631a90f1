"""The keys of a config file: verl's names wherever verl has the concept, sc's own beside them.

Each :class:`Key` names the :class:`~sc_trainer.TrainerConfig` field it sets (a dotted path
into the nested configurations: ``data.train_files``, ``actor_lr``) and, where the file spells
a value otherwise than the field holds it, how to convert (``algorithm.adv_estimator: gae`` is
``algorithm="ppo"``). Three keys of verl are counted in other units than sc's fields and are
computed from their neighbours (:data:`DERIVED`): ``actor_rollout_ref.actor.ppo_mini_batch_size``
(prompts per mini-batch; sc counts mini-batches), ``actor_rollout_ref.actor.use_kl_loss`` with
``kl_loss_coef`` (sc's ``kl_coef``, 0 for no KL loss) and ``trainer.n_gpus_per_node`` (sc's
``workers_per_role`` counts every node's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .._errors import TrainerConfigError

__all__ = ["DERIVED", "KEYS", "VERL_ONLY", "Key", "keys_by_name"]

#: what every checkpoint holds; ``hf_model`` adds a Hugging Face folder (``save_hf``)
SAVE_CONTENTS = ("model", "optimizer", "extra")


@dataclass(frozen=True)
class Key:
    """One key of a config file (see the module's documentation)."""

    name: str
    #: the field it sets, a dotted path into ``TrainerConfig`` (``""``: a derived key)
    field: str
    help: str
    #: the field's value from the file's (None: the same)
    load: Callable[[Any], Any] | None = None
    #: the file's value from the field's (None: the same)
    dump: Callable[[Any], Any] | None = None


def _adv_load(value: Any) -> Any:
    mapping = {"gae": "ppo", "ppo": "ppo", "grpo": "grpo"}
    if value not in mapping:
        raise TrainerConfigError(
            f"algorithm.adv_estimator must be 'gae' (PPO with a critic) or 'grpo', got {value!r}"
        )
    return mapping[value]


def _adv_dump(value: Any) -> Any:
    return "gae" if value == "ppo" else value


def _contents_load(value: Any) -> bool:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) for i in items):
        raise TrainerConfigError(
            f"actor_rollout_ref.actor.checkpoint.save_contents must be a list of names, got "
            f"{value!r}"
        )
    known = (*SAVE_CONTENTS, "hf_model")
    unknown = [i for i in items if i not in known]
    missing = [i for i in SAVE_CONTENTS if i not in items]
    if unknown or missing:
        raise TrainerConfigError(
            f"actor_rollout_ref.actor.checkpoint.save_contents={list(items)}: sc always saves "
            f"{list(SAVE_CONTENTS)} (to resume exactly) and may add 'hf_model'"
            + (f"; unknown: {unknown}" if unknown else f"; missing: {missing}")
        )
    return "hf_model" in items


def _contents_dump(value: Any) -> list[str]:
    return [*SAVE_CONTENTS, *(["hf_model"] if value else [])]


def _as_list(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _key(name: str, field: str, help: str, **kw: Any) -> Key:
    return Key(name, field, help, **kw)


D, A, R, C, T = (
    "data.",
    "actor_rollout_ref.actor.",
    "actor_rollout_ref.rollout.",
    "critic.",
    "trainer.",
)
M = "actor_rollout_ref.model."
#: every key, in the order a resolved config file lists them
KEYS: tuple[Key, ...] = (
    _key(
        f"{D}train_files",
        "data.train_files",
        "parquet or JSONL files in verl's schema",
        dump=_as_list,
    ),
    _key(
        f"{D}val_files",
        "data.val_files",
        "held-out files, validated every test_freq steps",
        dump=_as_list,
    ),
    _key(
        f"{D}prompt_key", "data.prompt_key", "the column of the prompt (chat messages or a string)"
    ),
    _key(
        f"{D}reward_fn_key",
        "data.reward_fn_key",
        "the column passed as data_source to the reward function",
    ),
    _key(f"{D}max_prompt_length", "data.max_prompt_length", "prompt tokens at most"),
    _key(f"{D}max_response_length", "data.max_response_length", "response tokens at most"),
    _key(
        f"{D}filter_overlong_prompts",
        "data.filter_overlong_prompts",
        "drop (and count) longer prompts",
    ),
    _key(f"{D}truncation", "data.truncation", "a longer prompt kept: error, left or right"),
    _key(f"{D}shuffle", "data.shuffle", "shuffle each epoch (drawn from the seed and the epoch)"),
    _key(f"{D}seed", "data.seed", "the shuffle's seed (null: trainer.seed)"),
    _key(f"{D}train_batch_size", "prompts_per_step", "prompts per step"),
    _key(
        f"{M}path",
        "model_path",
        "a local Hugging Face causal-LM directory (null: the built-in model)",
    ),
    _key(f"{M}hidden_size", "hidden_size", "the built-in model's width"),
    _key(f"{M}num_layers", "num_layers", "the built-in model's decoder layers"),
    _key(f"{M}num_heads", "num_heads", "the built-in model's attention heads"),
    _key(
        f"{M}absolute_positions",
        "absolute_positions",
        "the built-in model's learned absolute positions (null: on)",
    ),
    _key(f"{A}optim.lr", "actor_lr", "the actor's AdamW learning rate"),
    _key(
        f"{A}ppo_mini_batch_size",
        "",
        "prompts per optimizer step (train_batch_size / mini-batches)",
    ),
    _key(f"{A}ppo_epochs", "ppo_epochs", "passes over each batch"),
    _key(f"{A}clip_ratio", "clip_ratio", "the PPO ratio's clip range"),
    _key(f"{A}entropy_coeff", "entropy_coeff", "weight of the entropy bonus"),
    _key(f"{A}use_kl_loss", "", "a KL-to-reference term in the actor's loss"),
    _key(f"{A}kl_loss_coef", "", "its weight (low_var_kl)"),
    _key(
        f"{A}megatron.pipeline_model_parallel_size",
        "actor_pp",
        "pipeline stages of the actor and reference",
    ),
    _key(f"{A}ulysses_sequence_parallel_size", "sp", "Ulysses sequence parallelism"),
    _key(
        f"{A}checkpoint.save_contents",
        "save_hf",
        "what a checkpoint holds; add hf_model for a Hugging Face folder",
        load=_contents_load,
        dump=_contents_dump,
    ),
    _key(f"{R}name", "rollout_engine", "who generates: workers, builtin or vllm"),
    _key(f"{R}n", "responses_per_prompt", "samples per prompt (the GRPO group size)"),
    _key(f"{R}temperature", "temperature", "sampling temperature"),
    _key(
        f"{R}exact_window",
        "exact_window",
        "the exact mode: each sequence alone in an N-token window; 0: off (sc)",
    ),
    _key(
        f"{R}exact_check",
        "exact_check",
        "stop at the first token whose sampled log-prob differs from the actor's (sc)",
    ),
    _key(
        f"{R}tensor_model_parallel_size", "rollout_tp", "tensor parallelism of a separate rollout"
    ),
    _key(f"{R}placement", "placement", "colocated with the actor, or separate (sc)"),
    _key(f"{R}staleness", "async_staleness", "generate ahead, at most this many updates old (sc)"),
    _key(f"{R}num_servers", "rollout_servers", "engine servers of name builtin or vllm (sc)"),
    _key(
        f"{R}agent.extra_groups",
        "agent_extra_groups",
        "agent tasks: prompt groups kept running beyond a step's (sc)",
    ),
    _key(f"{R}agent.deadline_s", "agent_deadline_s", "agent tasks: a session's deadline (sc)"),
    _key(f"{C}optim.lr", "critic_lr", "the critic's AdamW learning rate"),
    _key(f"{C}colocate", "colocate", "the critic in the actor's processes (sc)"),
    _key(
        "algorithm.adv_estimator",
        "algorithm",
        "gae (PPO with a critic) or grpo",
        load=_adv_load,
        dump=_adv_dump,
    ),
    _key("algorithm.gamma", "gamma", "GAE discount"),
    _key("algorithm.lam", "lam", "GAE lambda"),
    _key(
        "algorithm.rollout_correction.rollout_is",
        "rollout_correction.rollout_is",
        "truncated importance weights: token, sequence or null (off)",
    ),
    _key(
        "algorithm.rollout_correction.rollout_is_threshold",
        "rollout_correction.rollout_is_threshold",
        "the weights' cap C (and the default rejection bound)",
    ),
    _key(
        "algorithm.rollout_correction.rollout_rs",
        "rollout_correction.rollout_rs",
        "rejection of tokens or sequences out of bounds: token, sequence or null (off)",
    ),
    _key(
        "algorithm.rollout_correction.rollout_rs_threshold",
        "rollout_correction.rollout_rs_threshold",
        "the ratio's upper bound (null: rollout_is_threshold)",
    ),
    _key(
        "algorithm.rollout_correction.rollout_rs_threshold_lower",
        "rollout_correction.rollout_rs_threshold_lower",
        "the ratio's lower bound (null: 1 / the upper)",
    ),
    _key(
        "custom_reward_function.path",
        "reward.path",
        "a Python file with the reward function (null: a built-in)",
    ),
    _key(
        "custom_reward_function.name",
        "reward.name",
        "its name (built-ins: compute_score, gsm8k, boxed)",
    ),
    _key("custom_reward_function.timeout_s", "reward.timeout_s", "a call's deadline (sc)"),
    _key("custom_reward_function.max_workers", "reward.max_workers", "calls at once (sc)"),
    _key(
        "custom_reward_function.on_error",
        "reward.on_error",
        "raise (stop, naming the row) or count (sc)",
    ),
    _key(f"{T}total_epochs", "data.total_epochs", "epochs, when total_training_steps is null"),
    _key(f"{T}total_training_steps", "steps", "steps (null: total_epochs of the data)"),
    _key(
        f"{T}logger", "tracking.logger", "console, jsonl, tensorboard, wandb, mlflow", dump=_as_list
    ),
    _key(f"{T}project_name", "tracking.project_name", "the trackers' project"),
    _key(f"{T}experiment_name", "tracking.experiment_name", "the trackers' run name"),
    _key(f"{T}save_freq", "save_every", "checkpoint every N steps (and after the last)"),
    _key(f"{T}test_freq", "val_every", "validate every N steps (before the first, after the last)"),
    _key(f"{T}default_local_dir", "output_dir", "the run's output folder"),
    _key(f"{T}max_actor_ckpt_to_keep", "keep_checkpoints", "complete checkpoints kept"),
    _key(f"{T}resume_mode", "resume_mode", "auto (continue from the output folder) or disable"),
    _key(f"{T}resume_from_path", "resume_from", "a checkpoint or output folder to continue from"),
    _key(f"{T}nnodes", "nnodes", "nodes"),
    _key(f"{T}n_gpus_per_node", "", "workers per role on each node"),
    _key(f"{T}device", "device", "cpu or cuda"),
    _key(f"{T}seed", "seed", "seed of sampling, initialisation and the data (sc)"),
    _key(f"{T}backend", "backend", "ray, or local: everything in this process (sc)"),
    _key(f"{T}num_cpus", "num_cpus", "CPUs the local Ray cluster declares (sc)"),
    _key(
        f"{T}background_checkpoints",
        "background_checkpoints",
        "workers write checkpoints while training goes on (sc)",
    ),
    _key(f"{T}max_recoveries", "max_recoveries", "worker deaths recovered from in place (sc)"),
    _key(f"{T}standby", "standby", "spare worker processes per group (sc)"),
    _key(f"{T}inject_fault", "inject_fault", "faults to inject, to test recovery (sc)"),
    _key(f"{T}run.id", "run.id", "a detached run's id (sc)"),
    _key(f"{T}run.address", "run.address", "the standing Ray cluster of a detached run (sc)"),
    _key(
        f"{T}run.abandon_s",
        "run.abandon_s",
        "a detached run without a driver releases itself after (sc)",
    ),
    _key(f"{T}run.attach", "run.attach", "only re-attach to the run (sc)"),
    _key("task.mode", "task.mode", "the built-in task without data: reverse, copy, tool-calc (sc)"),
    _key("task.length", "task.length", "digits per prompt of the built-in task (sc)"),
    _key("task.num_val", "task.num_val", "held-out prompts of the built-in task (sc)"),
    _key("task.split_seed", "task.split_seed", "seed of its train/validation split (sc)"),
)

#: the keys whose field is computed from their neighbours, and the fields they touch
DERIVED: dict[str, tuple[str, ...]] = {
    f"{A}ppo_mini_batch_size": ("ppo_mini_batches", "prompts_per_step"),
    f"{A}use_kl_loss": ("kl_coef",),
    f"{A}kl_loss_coef": ("kl_coef",),
    f"{T}n_gpus_per_node": ("workers_per_role", "nnodes"),
}

#: verl's keys that sc has no counterpart for, and why (an error says so)
VERL_ONLY: dict[str, str] = {
    f"{A}ppo_micro_batch_size_per_gpu": "sc sizes micro-batches itself from the mini-batch",
    f"{R}log_prob_micro_batch_size_per_gpu": "sc sizes micro-batches itself",
    f"{R}gpu_memory_utilization": "a vLLM setting of sc's vLLM servers, not of the trainer",
    f"{M}enable_gradient_checkpointing": "not implemented by sc's engines",
    f"{M}use_remove_padding": "sc's engines take padded batches",
    "reward_model.enable": "sc trains with rule rewards (custom_reward_function), no RM",
    "reward_model.reward_manager": "sc scores every row in parallel with one manager",
    f"{T}val_before_train": "sc always validates before the first step",
    f"{T}critic_warmup": "not implemented",
}


def keys_by_name() -> dict[str, Key]:
    """Every key, by its dotted name."""
    return {key.name: key for key in KEYS}
