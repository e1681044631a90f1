"""Typed configuration for the engines and workers.

Every dataclass validates itself in ``__post_init__`` and raises :class:`ConfigError` with
the offending numbers. Checks that need the data-parallel size (batch sizes divisible by it)
run when a worker is constructed, through :meth:`ActorConfig.normalized_batch_sizes` and
:meth:`CriticConfig.normalized_batch_sizes`. Field names follow verl's configuration so
that a verl YAML section maps onto these classes with :meth:`ConfigBase.from_dict`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin

from ._errors import ConfigError, UnsupportedParallelismError

__all__ = [
    "LOSS_AGG_MODES",
    "ActorConfig",
    "ActorRolloutRefConfig",
    "BatchSizes",
    "ConfigBase",
    "CriticConfig",
    "FSDPConfig",
    "MegatronConfig",
    "ModelConfig",
    "OptimConfig",
    "RefConfig",
    "RolloutConfig",
]

C = TypeVar("C", bound="ConfigBase")

LOSS_AGG_MODES = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_TYPES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
DTYPES = ("float32", "bfloat16", "float16")
STRATEGIES = ("fsdp", "fsdp2", "megatron")


def _positive(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ConfigError(f"{owner}.{name} must be a positive number, got {value!r}")


def _non_negative(owner: str, **values: int | float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ConfigError(f"{owner}.{name} must be >= 0, got {value!r}")


def _one_of(owner: str, name: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(f"{owner}.{name} must be one of {list(allowed)}, got {value!r}")


def _dataclass_type(hint: Any) -> type[ConfigBase] | None:
    """The ConfigBase subclass inside ``hint`` (``X`` or ``X | None``), if any."""
    candidates = [hint]
    if get_origin(hint) in (Union, types.UnionType):
        candidates = [a for a in get_args(hint) if a is not type(None)]
    for cand in candidates:
        if isinstance(cand, type) and issubclass(cand, ConfigBase):
            return cand
    return None


def _accepts_tuple(hint: Any) -> bool:
    """Whether ``hint`` is a tuple type, or a union with one (a YAML list becomes a tuple)."""
    if get_origin(hint) is tuple:
        return True
    if get_origin(hint) in (Union, types.UnionType):
        return any(get_origin(a) is tuple for a in get_args(hint))
    return False


class ConfigBase:
    """Shared behaviour: build from a (nested) mapping, convert back to a dict."""

    _section: ClassVar[str] = "config"
    __dataclass_fields__: ClassVar[dict[str, Any]]  # every subclass is a dataclass

    @classmethod
    def from_dict(cls: type[C], data: Mapping[str, Any]) -> C:
        """Build the dataclass from a mapping; nested sections become nested dataclasses.

        Unknown keys raise :class:`ConfigError` naming the key and the section.
        """
        if not isinstance(data, Mapping):
            raise ConfigError(f"{cls._section}: expected a mapping, got {type(data).__name__}")
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ConfigError(
                f"{cls._section}: unknown keys {unknown}; known keys are {sorted(names)}"
            )
        kwargs: dict[str, Any] = {}
        for key, value in data.items():
            nested = _dataclass_type(hints[key])
            if nested is not None and isinstance(value, Mapping):
                kwargs[key] = nested.from_dict(value)
            elif isinstance(value, list) and _accepts_tuple(hints[key]):
                kwargs[key] = tuple(value)
            else:
                kwargs[key] = value
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        """A plain nested dict (``dataclasses.asdict``)."""
        out: dict[str, Any] = dataclasses.asdict(self)
        return out


@dataclass
class ModelConfig(ConfigBase):
    """The model: the built-in causal transformer, or a local Hugging Face model (``path``).

    The built-in model is initialised from ``seed`` identically on every rank, so an actor
    and its reference model start from the same weights. ``path`` needs ``sc-workers[hf]``
    and a directory on local disk (nothing is downloaded); the architecture then comes from
    that directory's ``config.json``, and the architecture fields here are informational
    (:func:`~sc_workers.hf_model_config` fills them, and the token ids, from the directory).
    With ``path`` the seed initialises what the checkpoint does not hold (a critic's value
    head), identically on every rank. ``eos_token_id`` is one id or a tuple of ids (any of
    them ends a response).
    """

    _section: ClassVar[str] = "model"

    path: str | None = None
    vocab_size: int = 32
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 64
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    pad_token_id: int = 0
    eos_token_id: int | tuple[int, ...] = 1
    seed: int = 0
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    def __post_init__(self) -> None:
        o = self._section
        _positive(
            o,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
        )
        # the built-in model's shape rules; a Hugging Face model brings its own architecture
        if self.path is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{o}.hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.path is None and (self.hidden_size // self.num_attention_heads) % 2:
            raise ConfigError(
                f"{o}: head dim {self.hidden_size // self.num_attention_heads} "
                f"(hidden_size {self.hidden_size} / num_attention_heads "
                f"{self.num_attention_heads}) must be even for rotary embeddings"
            )
        given: object = self.eos_token_id
        if isinstance(given, list):  # a list from code rather than through from_dict
            self.eos_token_id = tuple(given)
        if self.eos_token_id == ():
            raise ConfigError(f"{o}.eos_token_id must name at least one token, got ()")
        ids: list[tuple[str, object]] = [("pad_token_id", self.pad_token_id)]
        ids += [("eos_token_id", v) for v in self.eos_token_ids]
        for name, value in ids:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{o}.{name} must be an int, got {value!r}")
            if not 0 <= value < self.vocab_size:
                raise ConfigError(
                    f"{o}.{name} {value} is outside [0, vocab_size {self.vocab_size})"
                )
        _one_of(o, "dtype", self.dtype, DTYPES)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """``eos_token_id`` as a tuple."""
        eos = self.eos_token_id
        return eos if isinstance(eos, tuple) else (eos,)


@dataclass
class OptimConfig(ConfigBase):
    """AdamW with a linear warmup followed by a constant or cosine schedule (verl's names).

    The warmup lasts ``lr_warmup_steps`` steps, or, when that is negative,
    ``lr_warmup_steps_ratio * total_training_steps``. The cosine schedule decays to
    ``min_lr_ratio * lr`` at ``total_training_steps``.
    """

    _section: ClassVar[str] = "optim"

    lr: float = 1e-6
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.01
    lr_warmup_steps: int = -1
    lr_warmup_steps_ratio: float = 0.0
    warmup_style: Literal["constant", "cosine"] = "constant"
    min_lr_ratio: float = 0.0
    total_training_steps: int = -1

    def __post_init__(self) -> None:
        o = self._section
        _non_negative(o, lr=self.lr, weight_decay=self.weight_decay)
        _positive(o, eps=self.eps)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"{o}.betas must be two numbers in [0, 1), got {self.betas!r}")
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            raise ConfigError(
                f"{o}.lr_warmup_steps_ratio must be in [0, 1], got {self.lr_warmup_steps_ratio}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"{o}.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        _one_of(o, "warmup_style", self.warmup_style, ("constant", "cosine"))
        needs_total = self.warmup_style == "cosine" or (
            self.lr_warmup_steps < 0 and self.lr_warmup_steps_ratio > 0
        )
        if needs_total and self.total_training_steps <= 0:
            raise ConfigError(
                f"{o}.total_training_steps must be set (> 0) for warmup_style "
                f"{self.warmup_style!r} with lr_warmup_steps {self.lr_warmup_steps} and "
                f"lr_warmup_steps_ratio {self.lr_warmup_steps_ratio}, "
                f"got {self.total_training_steps}"
            )

    @property
    def num_warmup_steps(self) -> int:
        if self.lr_warmup_steps >= 0:
            return self.lr_warmup_steps
        return int(self.lr_warmup_steps_ratio * max(self.total_training_steps, 0))


@dataclass
class FSDPConfig(ConfigBase):
    """FSDP2 settings (verl's ``fsdp_config``), also used for the dp dimension of megatron.

    ``fsdp_size`` -1 shards over all dp ranks; a divisor of the dp size gives HSDP (shard
    within groups of ``fsdp_size`` ranks, replicate across groups). ``param_dtype`` "auto"
    is bfloat16 on a CUDA device that supports it and float32 otherwise. Offloading moves
    parameters / optimizer state to CPU between stages; it is a no-op on a CPU device.
    """

    _section: ClassVar[str] = "fsdp_config"

    fsdp_size: int = -1
    param_offload: bool = False
    optimizer_offload: bool = False
    reshard_after_forward: bool = True
    param_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    reduce_dtype: Literal["float32", "bfloat16", "float16"] = "float32"

    def __post_init__(self) -> None:
        o = self._section
        if self.fsdp_size != -1 and (isinstance(self.fsdp_size, bool) or self.fsdp_size < 1):
            raise ConfigError(f"{o}.fsdp_size must be -1 or a positive int, got {self.fsdp_size!r}")
        _one_of(o, "param_dtype", self.param_dtype, ("auto", *DTYPES))
        _one_of(o, "reduce_dtype", self.reduce_dtype, DTYPES)


@dataclass
class MegatronConfig(ConfigBase):
    """Model-parallel sizes of the megatron-style engine (verl's names).

    ``pipeline_model_parallel_size`` > 1 is not implemented in this release and raises
    :class:`UnsupportedParallelismError`.
    """

    _section: ClassVar[str] = "megatron"

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1

    def __post_init__(self) -> None:
        o = self._section
        _positive(
            o,
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
        )
        if self.pipeline_model_parallel_size > 1:
            raise UnsupportedParallelismError(
                f"{o}.pipeline_model_parallel_size {self.pipeline_model_parallel_size}: "
                "pipeline parallelism is not implemented in sc-workers 0.1; use "
                "tensor_model_parallel_size x data parallelism"
            )


@dataclass(frozen=True)
class BatchSizes:
    """Per-dp-rank batch sizes after normalisation by the dp size."""

    mini_batch_size: int
    micro_batch_size: int

    @property
    def grad_accumulation(self) -> int:
        return self.mini_batch_size // self.micro_batch_size


def _check_strategy(owner: str, strategy: str, megatron: MegatronConfig) -> None:
    _one_of(owner, "strategy", strategy, STRATEGIES)
    if strategy != "megatron" and megatron.tensor_model_parallel_size > 1:
        raise ConfigError(
            f"{owner}: megatron.tensor_model_parallel_size "
            f"{megatron.tensor_model_parallel_size} needs strategy 'megatron', got {strategy!r}"
        )


def _normalize(
    owner: str, mini: int, n: int, micro: int, dp_size: int, mini_name: str, micro_name: str
) -> BatchSizes:
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

    def __post_init__(self) -> None:
        o = self._section
        _check_strategy(o, self.strategy, self.megatron)
        _positive(
            o,
            ppo_mini_batch_size=self.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=self.ppo_micro_batch_size_per_gpu,
            ppo_epochs=self.ppo_epochs,
            clip_ratio=self.clip_ratio,
            grad_clip=self.grad_clip,
        )
        for name in ("clip_ratio_low", "clip_ratio_high"):
            value = getattr(self, name)
            if value is not None:
                _positive(o, **{name: value})
        if self.clip_ratio_c <= 1.0:
            raise ConfigError(
                f"{o}.clip_ratio_c must be > 1.0 (dual clip), got {self.clip_ratio_c}"
            )
        _one_of(o, "loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _one_of(o, "kl_loss_type", self.kl_loss_type, KL_TYPES)
        _non_negative(o, kl_loss_coef=self.kl_loss_coef)

    @property
    def cliprange_low(self) -> float:
        return self.clip_ratio if self.clip_ratio_low is None else self.clip_ratio_low

    @property
    def cliprange_high(self) -> float:
        return self.clip_ratio if self.clip_ratio_high is None else self.clip_ratio_high

    def normalized_batch_sizes(self, rollout_n: int, dp_size: int) -> BatchSizes:
        """Per-rank mini- and micro-batch sizes; :class:`ConfigError` if they do not divide."""
        return _normalize(
            self._section,
            self.ppo_mini_batch_size,
            rollout_n,
            self.ppo_micro_batch_size_per_gpu,
            dp_size,
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
        )


@dataclass
class RolloutConfig(ConfigBase):
    """Sampling (verl's ``actor_rollout_ref.rollout``); an in-engine sampler, no vLLM.

    ``top_k`` <= 0 and ``top_p`` 1.0 disable those filters. ``response_length`` is the
    number of new tokens generated (responses are right-padded to it). ``n`` is the number
    of samples per prompt: the trainer repeats the prompts (``batch.repeat(n,
    interleave=True)``) before ``generate_sequences``; the actor uses it to size
    mini-batches.
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

    def __post_init__(self) -> None:
        o = self._section
        _positive(
            o,
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

    def __post_init__(self) -> None:
        _check_strategy(self._section, self.strategy, self.megatron)
        _positive(
            self._section, log_prob_micro_batch_size_per_gpu=self.log_prob_micro_batch_size_per_gpu
        )


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
        _one_of(self._section, "device", self.device, ("auto", "cpu", "cuda"))
        a_tp = self.actor.megatron.tensor_model_parallel_size
        r_tp = self.ref.megatron.tensor_model_parallel_size
        if a_tp != r_tp:
            raise ConfigError(
                f"{self._section}: actor tensor_model_parallel_size {a_tp} differs from ref "
                f"tensor_model_parallel_size {r_tp}; one worker has one mesh layout"
            )
        _check_tp_divides(self._section, self.model, a_tp)


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

    def __post_init__(self) -> None:
        o = self._section
        _check_strategy(o, self.strategy, self.megatron)
        _positive(
            o,
            ppo_mini_batch_size=self.ppo_mini_batch_size,
            ppo_micro_batch_size_per_gpu=self.ppo_micro_batch_size_per_gpu,
            forward_micro_batch_size_per_gpu=self.forward_micro_batch_size_per_gpu,
            ppo_epochs=self.ppo_epochs,
            cliprange_value=self.cliprange_value,
            grad_clip=self.grad_clip,
            rollout_n=self.rollout_n,
        )
        _one_of(o, "loss_agg_mode", self.loss_agg_mode, LOSS_AGG_MODES)
        _one_of(o, "device", self.device, ("auto", "cpu", "cuda"))
        _check_tp_divides(o, self.model, self.megatron.tensor_model_parallel_size)

    def normalized_batch_sizes(self, dp_size: int) -> BatchSizes:
        """Per-rank mini- and micro-batch sizes; :class:`ConfigError` if they do not divide."""
        return _normalize(
            self._section,
            self.ppo_mini_batch_size,
            self.rollout_n,
            self.ppo_micro_batch_size_per_gpu,
            dp_size,
            "ppo_mini_batch_size",
            "ppo_micro_batch_size_per_gpu",
        )


def _check_tp_divides(owner: str, model: ModelConfig, tp: int) -> None:
    # A Hugging Face model's head counts live in its config.json: hf_worker_configs checks
    # them when it reads the directory, and the megatron engine when it loads the model.
    if tp == 1 or model.path is not None:
        return
    if model.num_attention_heads % tp:
        raise ConfigError(
            f"{owner}: model.num_attention_heads {model.num_attention_heads} is not divisible "
            f"by tensor_model_parallel_size {tp}"
        )
    if model.intermediate_size % tp:
        raise ConfigError(
            f"{owner}: model.intermediate_size {model.intermediate_size} is not divisible by "
            f"tensor_model_parallel_size {tp}"
        )
