"""The engine sections: the optimizer, FSDP2 sharding and megatron-style model parallelism,
and the checks that tie a role's strategy and tensor-parallel size to its model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from .._errors import ConfigError
from ._base import DTYPES, STRATEGIES, ConfigBase, non_negative, one_of, positive
from ._model import ModelConfig

__all__ = [
    "FSDPConfig",
    "MegatronConfig",
    "OptimConfig",
    "PIPELINE_SCHEDULES",
    "check_sp_divides",
    "check_strategy",
    "check_tp_divides",
]


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
        non_negative(o, lr=self.lr, weight_decay=self.weight_decay)
        positive(o, eps=self.eps)
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ConfigError(f"{o}.betas must be two numbers in [0, 1), got {self.betas!r}")
        if not 0.0 <= self.lr_warmup_steps_ratio <= 1.0:
            raise ConfigError(
                f"{o}.lr_warmup_steps_ratio must be in [0, 1], got {self.lr_warmup_steps_ratio}"
            )
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise ConfigError(f"{o}.min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        one_of(o, "warmup_style", self.warmup_style, ("constant", "cosine"))
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
        one_of(o, "param_dtype", self.param_dtype, ("auto", *DTYPES))
        one_of(o, "reduce_dtype", self.reduce_dtype, DTYPES)


PIPELINE_SCHEDULES = ("auto", "1F1B", "GPipe", "Interleaved1F1B")


@dataclass
class MegatronConfig(ConfigBase):
    """Model-parallel sizes of the megatron-style engine (verl's names).

    ``pipeline_model_parallel_size`` splits the decoder layers into that many stages (one
    per rank of a pipeline group); ``virtual_pipeline_model_parallel_size`` gives each rank
    that many smaller stages, run by the interleaved 1F1B schedule. ``pipeline_schedule``
    "auto" is 1F1B, or interleaved 1F1B when there are virtual stages; "GPipe" runs every
    micro-batch's forward before any backward.
    """

    _section: ClassVar[str] = "megatron"

    tensor_model_parallel_size: int = 1
    pipeline_model_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    pipeline_schedule: Literal["auto", "1F1B", "GPipe", "Interleaved1F1B"] = "auto"

    def __post_init__(self) -> None:
        o = self._section
        positive(
            o,
            tensor_model_parallel_size=self.tensor_model_parallel_size,
            pipeline_model_parallel_size=self.pipeline_model_parallel_size,
        )
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None:
            positive(o, virtual_pipeline_model_parallel_size=vpp)
            if vpp > 1 and self.pipeline_model_parallel_size == 1:
                raise ConfigError(
                    f"{o}.virtual_pipeline_model_parallel_size {vpp} needs "
                    "pipeline_model_parallel_size > 1"
                )
        one_of(o, "pipeline_schedule", self.pipeline_schedule, PIPELINE_SCHEDULES)
        schedule = self.pipeline_schedule
        if self.virtual_stages > 1 and schedule not in ("auto", "Interleaved1F1B"):
            raise ConfigError(
                f"{o}.pipeline_schedule {schedule!r} runs one stage per rank; "
                f"virtual_pipeline_model_parallel_size {vpp} needs 'Interleaved1F1B' (or 'auto')"
            )
        if schedule == "Interleaved1F1B" and self.virtual_stages == 1:
            raise ConfigError(
                f"{o}.pipeline_schedule 'Interleaved1F1B' needs "
                "virtual_pipeline_model_parallel_size > 1"
            )

    @property
    def virtual_stages(self) -> int:
        """Stages per pipeline rank (1 without virtual pipelining)."""
        return self.virtual_pipeline_model_parallel_size or 1

    @property
    def schedule(self) -> str:
        """The schedule that runs: "1F1B", "GPipe" or "Interleaved1F1B"."""
        if self.pipeline_schedule != "auto":
            return self.pipeline_schedule
        return "Interleaved1F1B" if self.virtual_stages > 1 else "1F1B"


def check_strategy(
    owner: str, strategy: str, megatron: MegatronConfig, ulysses_sequence_parallel_size: int = 1
) -> None:
    """The strategy is known, and its parallel sizes are ones it implements: tensor and
    pipeline parallelism need "megatron", Ulysses sequence parallelism needs FSDP."""
    one_of(owner, "strategy", strategy, STRATEGIES)
    sp = ulysses_sequence_parallel_size
    if isinstance(sp, bool) or not isinstance(sp, int) or sp < 1:
        raise ConfigError(
            f"{owner}.ulysses_sequence_parallel_size must be a positive int, got {sp!r}"
        )
    if strategy != "megatron":
        for name in ("tensor_model_parallel_size", "pipeline_model_parallel_size"):
            size = getattr(megatron, name)
            if size > 1:
                raise ConfigError(
                    f"{owner}: megatron.{name} {size} needs strategy 'megatron', got {strategy!r}"
                )
    elif sp > 1:
        raise ConfigError(
            f"{owner}: ulysses_sequence_parallel_size {sp} is a feature of the FSDP engine; "
            "strategy 'megatron' splits the model with tensor and pipeline parallelism instead"
        )


def _check_divides(owner: str, model: ModelConfig, size: int, name: str, field: str) -> None:
    """The built-in model's ``field`` divides by the parallel size ``name`` (``size``); a
    size of 1 and a Hugging Face model (``model.path``) pass."""
    if size == 1 or model.path is not None:
        return
    value: int = getattr(model, field)
    if value % size:
        raise ConfigError(f"{owner}: model.{field} {value} is not divisible by {name} {size}")


def check_tp_divides(owner: str, model: ModelConfig, tp: int) -> None:
    # A Hugging Face model's head counts live in its config.json: hf_worker_configs checks
    # them when it reads the directory, and the megatron engine when it loads the model.
    _check_divides(owner, model, tp, "tensor_model_parallel_size", "num_attention_heads")
    _check_divides(owner, model, tp, "tensor_model_parallel_size", "intermediate_size")


def check_sp_divides(owner: str, model: ModelConfig, sp: int) -> None:
    """Ulysses sequence parallelism splits the attention heads over the sp ranks: the
    built-in model's head count must divide by ``sp``."""
    # A Hugging Face model's head count lives in its config.json: hf_worker_configs checks
    # it when it reads the directory, and the FSDP engine when it loads the model.
    _check_divides(owner, model, sp, "ulysses_sequence_parallel_size", "num_attention_heads")
