"""The role sections: actor, rollout, reference, their union ``actor_rollout_ref``, and the
critic, with the per-dp-rank batch sizes that the actor and critic derive when a worker is
built (:class:`BatchSizes`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

from .._errors import ConfigError
from ._base import KL_TYPES, LOSS_AGG_MODES, ConfigBase, non_negative, one_of, positive
from ._engine import (
    FSDPConfig,
    MegatronConfig,
    OptimConfig,
    check_sp_divides,
    check_strategy,
    check_tp_divides,
)
from ._model import ModelConfig

__all__ = [
    "ActorConfig",
    "ActorRolloutRefConfig",
    "BatchSizes",
    "CriticConfig",
    "ParallelSizes",
    "RefConfig",
    "RolloutConfig",
]


@dataclass(frozen=True)
class ParallelSizes:
    """A role's model-parallel sizes: tensor (tp), pipeline (pp, with vpp virtual stages
    per rank) and Ulysses sequence parallelism (sp); the dp size is what the world size
    leaves."""

    tp: int = 1
    pp: int = 1
    sp: int = 1
    vpp: int = 1


def parallel_sizes(strategy: str, megatron: MegatronConfig, sp: int) -> ParallelSizes:
    if strategy == "megatron":
        return ParallelSizes(
            megatron.tensor_model_parallel_size,
            megatron.pipeline_model_parallel_size,
            1,
            megatron.virtual_stages,
        )
    return ParallelSizes(sp=sp)


@dataclass(frozen=True)
class BatchSizes:
    """Per-dp-rank batch sizes after normalisation by the dp size."""

    mini_batch_size: int
    micro_batch_size: int

    @property
    def grad_accumulation(self) -> int:
        return self.mini_batch_size // self.micro_batch_size


DEVICES = ("auto", "cpu", "cuda")


class _PPORole(Protocol):
    """The fields that the PPO roles (actor and critic) share."""

    _section: ClassVar[str]

    @property
    def strategy(self) -> str: ...
    @property
    def megatron(self) -> MegatronConfig: ...
    @property
    def ulysses_sequence_parallel_size(self) -> int: ...
    @property
    def ppo_mini_batch_size(self) -> int: ...
    @property
    def ppo_micro_batch_size_per_gpu(self) -> int: ...
    @property
    def ppo_epochs(self) -> int: ...
    @property
    def grad_clip(self) -> float: ...
    @property
    def loss_agg_mode(self) -> str: ...


def check_ppo_role(
    role: _PPORole,
    *,
    clip: Mapping[str, float],
    micro_batch_sizes: Mapping[str, int] | None = None,
    counts: Mapping[str, int] | None = None,
    clip_bounds: Callable[[], None] | None = None,
) -> None:
    """The checks the actor and the critic share, in this order: the strategy and its
    parallel sizes; positive mini- and micro-batch sizes (then the role's other
    ``micro_batch_sizes``), epochs, clip range(s) ``clip``, gradient clip (then the role's
    other positive ``counts``); the role's further ``clip_bounds`` checks; a known
    ``loss_agg_mode``. Each :class:`ConfigError` names the section, the key and the value."""
    o = role._section
    check_strategy(o, role.strategy, role.megatron, role.ulysses_sequence_parallel_size)
    positive(
        o,
        ppo_mini_batch_size=role.ppo_mini_batch_size,
        ppo_micro_batch_size_per_gpu=role.ppo_micro_batch_size_per_gpu,
        **(micro_batch_sizes or {}),
        ppo_epochs=role.ppo_epochs,
        **clip,
        grad_clip=role.grad_clip,
        **(counts or {}),
    )
    if clip_bounds is not None:
        clip_bounds()
    one_of(o, "loss_agg_mode", role.loss_agg_mode, LOSS_AGG_MODES)


def check_model_fits(owner: str, model: ModelConfig, sizes: ParallelSizes) -> None:
    """The built-in model splits over the role's tensor- and sequence-parallel sizes."""
    check_tp_divides(owner, model, sizes.tp)
    check_sp_divides(owner, model, sizes.sp)


def normalize_batch_sizes(role: _PPORole, n: int, dp_size: int) -> BatchSizes:
    """A PPO role's per-rank mini- and micro-batch sizes for rollout ``n`` and ``dp_size``."""
    owner, mini, micro = role._section, role.ppo_mini_batch_size, role.ppo_micro_batch_size_per_gpu
    mini_name, micro_name = "ppo_mini_batch_size", "ppo_micro_batch_size_per_gpu"
    if dp_size < 1:
        raise ConfigError(f"{owner}: dp size must be positive, got {dp_size}")
    total = mini * n
    if total % dp_size:
        raise ConfigError(
            f"{owner}.{mini_name} {mini} (x rollout n {n} = {total} sequences) "
            f"is not divisible by dp size {dp_size}"
        )
    per_rank = total // dp_size
    if per_rank % micro:
        raise ConfigError(
            f"{owner}: per-rank mini-batch {per_rank} ({mini_name} {mini} x n {n} / dp size "
            f"{dp_size}) is not divisible by {micro_name} {micro}"
        )
    return BatchSizes(per_rank, micro)


@dataclass
class ActorConfig(ConfigBase):
    """The PPO actor (verl's ``actor_rollout_ref.actor``).

    ``ppo_mini_batch_size`` counts prompts, as in verl: a mini-batch holds
    ``ppo_mini_batch_size * rollout.n`` sequences, split over the dp ranks.
    ``clip_ratio_low`` / ``clip_ratio_high`` default to ``clip_ratio``; ``clip_ratio_c`` is the
    dual-clip bound for negative advantages (> 1).
    """

    _section: ClassVar[str] = "actor"

    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp"
    ppo_mini_batch_size: int = 4
    ppo_micro_batch_size_per_gpu: int = 2
    ppo_epochs: int = 1
    shuffle: bool = False
    clip_ratio: float = 0.2
    clip_ratio_low: float | None = None
    clip_ratio_high: float | None = None
    clip_ratio_c: float = 3.0
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    entropy_coeff: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.001
    kl_loss_type: str = "low_var_kl"
    grad_clip: float = 1.0
    data_loader_seed: int = 0
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    ulysses_sequence_parallel_size: int = 1

    def __post_init__(self) -> None:
        o = self._section
        check_ppo_role(self, clip={"clip_ratio": self.clip_ratio}, clip_bounds=self._check_clips)
        one_of(o, "kl_loss_type", self.kl_loss_type, KL_TYPES)
        non_negative(o, kl_loss_coef=self.kl_loss_coef)

    @property
    def parallel_sizes(self) -> ParallelSizes:
        return parallel_sizes(self.strategy, self.megatron, self.ulysses_sequence_parallel_size)

    def _check_clips(self) -> None:
        o = self._section
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None:
                positive(o, **{name: value})
        if self.clip_ratio_c <= 1.0:
            raise ConfigError(
                f"{o}.clip_ratio_c must be > 1.0 (dual clip), got {self.clip_ratio_c}"
            )

    @property
    def cliprange_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def cliprange_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    def normalized_batch_sizes(self, rollout_n: int, dp_size: int) -> BatchSizes:
        """Per-rank mini- and micro-batch sizes; :class:`ConfigError` if they do not divide."""
        return normalize_batch_sizes(self, rollout_n, dp_size)


@dataclass
class RolloutConfig(ConfigBase):
    """Sampling (verl's ``actor_rollout_ref.rollout``); an in-engine sampler, no vLLM.

    ``top_k`` <= 0 and ``top_p`` 1.0 disable those filters. ``response_length`` is the
    number of new tokens generated (responses are right-padded to it). ``n`` is the number
    of samples per prompt: the trainer repeats the prompts (``batch.repeat(n,
    interleave=True)``) before ``generate_sequences``; the actor uses it to size
    mini-batches. ``tensor_model_parallel_size`` is the tensor-parallel size of a separately
    placed :class:`~sc_workers.RolloutWorker` group (its other ranks are replicas); the
    hybrid actor samples with the actor's own layout.

    ``exact_window`` > 0 turns on the exact mode: sampling, ``compute_log_prob`` and
    ``update_actor`` run each sequence alone, left-aligned in a row of ``exact_window``
    tokens (:func:`~sc_workers.models.window_forward`), so the log-probs the sampler reports
    equal the actor's recomputation bit for bit and the first PPO ratio of an update is
    exactly 1 (on one device type and dtype; slower: no batching, no key/value cache). It
    must be at least the prompt width plus ``response_length``; 0 (the default) is off.
    """

    _section: ClassVar[str] = "rollout"

    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    do_sample: bool = True
    response_length: int = 8
    n: int = 1
    log_prob_micro_batch_size_per_gpu: int = 2
    seed: int = 0
    tensor_model_parallel_size: int = 1
    exact_window: int = 0

    def __post_init__(self) -> None:
        o = self._section
        if isinstance(self.exact_window, bool) or self.exact_window < 0:
            raise ConfigError(
                f"{o}.exact_window must be an int >= 0 (0: off), got {self.exact_window!r}"
            )
        positive(
            o,
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            temperature=self.temperature,
            response_length=self.response_length,
            n=self.n,
            log_prob_micro_batch_size_per_gpu=self.log_prob_micro_batch_size_per_gpu,
        )
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"{o}.top_p must be in (0, 1], got {self.top_p}")


@dataclass
class RefConfig(ConfigBase):
    """The reference policy (verl's ``actor_rollout_ref.ref``)."""

    _section: ClassVar[str] = "ref"

    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp"
    log_prob_micro_batch_size_per_gpu: int = 2
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    ulysses_sequence_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_strategy(
            self._section, self.strategy, self.megatron, self.ulysses_sequence_parallel_size
        )
        positive(
            self._section, log_prob_micro_batch_size_per_gpu=self.log_prob_micro_batch_size_per_gpu
        )

    @property
    def parallel_sizes(self) -> ParallelSizes:
        return parallel_sizes(self.strategy, self.megatron, self.ulysses_sequence_parallel_size)


@dataclass
class ActorRolloutRefConfig(ConfigBase):
    """Everything :class:`ActorRolloutRefWorker` needs (verl's ``actor_rollout_ref``).

    ``device`` "auto" picks CUDA when available (backend nccl) and CPU otherwise (gloo);
    the environment variable ``SC_WORKERS_DEVICE`` overrides it. The actor and reference
    model must use the same parallel layout (same strategy and tensor-parallel size).
    """

    _section: ClassVar[str] = "actor_rollout_ref"

    model: ModelConfig = field(default_factory=ModelConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    ref: RefConfig = field(default_factory=RefConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"

    def __post_init__(self) -> None:
        one_of(self._section, "device", self.device, DEVICES)
        actor, ref = self.actor.parallel_sizes, self.ref.parallel_sizes
        if actor != ref:
            raise ConfigError(
                f"{self._section}: the actor's parallel sizes {actor} differ from the ref's "
                f"{ref}; one worker has one mesh layout"
            )
        if self.rollout.exact_window and (actor.pp > 1 or actor.sp > 1):
            raise ConfigError(
                f"{self._section}: rollout.exact_window runs each sequence alone through the "
                f"whole model; it is not combined with pipeline or sequence parallelism "
                f"(actor parallel sizes {actor})"
            )
        check_model_fits(self._section, self.model, actor)


@dataclass
class CriticConfig(ConfigBase):
    """The PPO critic (verl's ``critic``); ``rollout_n`` scales ``ppo_mini_batch_size``."""

    _section: ClassVar[str] = "critic"

    model: ModelConfig = field(default_factory=ModelConfig)
    strategy: Literal["fsdp", "fsdp2", "megatron"] = "fsdp"
    ppo_mini_batch_size: int = 4
    ppo_micro_batch_size_per_gpu: int = 2
    forward_micro_batch_size_per_gpu: int = 2
    ppo_epochs: int = 1
    shuffle: bool = False
    cliprange_value: float = 0.5
    loss_agg_mode: Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"] = "token-mean"
    grad_clip: float = 1.0
    rollout_n: int = 1
    data_loader_seed: int = 0
    optim: OptimConfig = field(default_factory=OptimConfig)
    fsdp_config: FSDPConfig = field(default_factory=FSDPConfig)
    megatron: MegatronConfig = field(default_factory=MegatronConfig)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    ulysses_sequence_parallel_size: int = 1

    def __post_init__(self) -> None:
        check_ppo_role(
            self,
            micro_batch_sizes={
                "forward_micro_batch_size_per_gpu": self.forward_micro_batch_size_per_gpu
            },
            clip={"cliprange_value": self.cliprange_value},
            counts={"rollout_n": self.rollout_n},
        )
        one_of(self._section, "device", self.device, DEVICES)
        check_model_fits(self._section, self.model, self.parallel_sizes)

    @property
    def parallel_sizes(self) -> ParallelSizes:
        return parallel_sizes(self.strategy, self.megatron, self.ulysses_sequence_parallel_size)

    def normalized_batch_sizes(self, dp_size: int) -> BatchSizes:
        """Per-rank mini- and micro-batch sizes; :class:`ConfigError` if they do not divide."""
        return normalize_batch_sizes(self, self.rollout_n, dp_size)
