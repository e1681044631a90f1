"""The sections of a run's configuration that describe the user's own task: the data
(:class:`DataConfig`), the reward function (:class:`RewardConfig`), where the metrics go
(:class:`TrackingConfig`), and the rollout correction (:class:`RolloutCorrectionConfig`). Their
keys in a config file are verl's (``data.*``,
``custom_reward_function.*``, ``trainer.logger``, ...; see ``_keys.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from sc_workers import ConfigError
from sc_workers.algos import check_rollout_correction

from .._errors import TrainerConfigError, int_at_least

__all__ = [
    "DataConfig",
    "LOGGERS",
    "ON_REWARD_ERROR",
    "OnRewardError",
    "ROLLOUT_CORRECTION_KEY",
    "RewardConfig",
    "RolloutCorrectionConfig",
    "TRUNCATIONS",
    "TrackingConfig",
    "Truncation",
]

#: what a prompt longer than ``max_prompt_length`` becomes when it is not filtered out
Truncation = Literal["error", "left", "right"]
TRUNCATIONS: tuple[Truncation, ...] = get_args(Truncation)
#: what a reward function that fails does to the run
OnRewardError = Literal["raise", "count"]
ON_REWARD_ERROR: tuple[OnRewardError, ...] = get_args(OnRewardError)
#: the experiment trackers ``trainer.logger`` may name
LOGGERS = ("console", "jsonl", "tensorboard", "wandb", "mlflow")


def _files(owner: str, value: object) -> tuple[str, ...]:
    """One path or several, as a tuple of non-empty strings."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(i, str) and i for i in items):
        raise TrainerConfigError(f"{owner} must be a path or a list of paths, got {value!r}")
    return tuple(items)


def _positive_int(owner: str, value: object) -> None:
    int_at_least(value, 1, owner)


@dataclass(frozen=True)
class DataConfig:
    """The user's dataset: parquet or JSONL files in verl's schema (``data_source``,
    ``prompt`` as chat messages or a string, ``reward_model.ground_truth``, ``extra_info``).

    No ``train_files``: the run trains a built-in task (``TrainerConfig.task``).
    ``max_prompt_length`` / ``max_response_length`` are in tokens of the model's tokenizer;
    a longer prompt is dropped and counted (``filter_overlong_prompts``), else truncated
    (``truncation`` "left" or "right") or refused ("error"). ``shuffle`` draws each epoch's
    order from ``seed`` (``None``: the run's seed) and the epoch alone, so a resumed run sees
    exactly the samples an uninterrupted one would. ``total_epochs`` sets the run's length
    when ``TrainerConfig.steps`` is not given (``sc-train``'s ``trainer.total_epochs``).
    """

    train_files: tuple[str, ...] = ()
    val_files: tuple[str, ...] = ()
    prompt_key: str = "prompt"
    reward_fn_key: str = "data_source"
    max_prompt_length: int = 512
    max_response_length: int = 512
    filter_overlong_prompts: bool = True
    truncation: Truncation = "error"
    shuffle: bool = True
    seed: int | None = None
    total_epochs: int = 1

    def __post_init__(self) -> None:
        owner = "DataConfig"
        object.__setattr__(self, "train_files", _files(f"{owner}.train_files", self.train_files))
        object.__setattr__(self, "val_files", _files(f"{owner}.val_files", self.val_files))
        if self.val_files and not self.train_files:
            raise TrainerConfigError(f"{owner}: val_files without train_files")
        for name in ("prompt_key", "reward_fn_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TrainerConfigError(f"{owner}.{name} must be a non-empty str, got {value!r}")
        _positive_int(f"{owner}.max_prompt_length", self.max_prompt_length)
        _positive_int(f"{owner}.max_response_length", self.max_response_length)
        _positive_int(f"{owner}.total_epochs", self.total_epochs)
        if self.truncation not in TRUNCATIONS:
            raise TrainerConfigError(
                f"{owner}.truncation must be one of {TRUNCATIONS}, got {self.truncation!r}"
            )
        for name in ("filter_overlong_prompts", "shuffle"):
            if not isinstance(getattr(self, name), bool):
                raise TrainerConfigError(
                    f"{owner}.{name} must be a bool, got {getattr(self, name)!r}"
                )
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise TrainerConfigError(f"{owner}.seed must be an int or None, got {self.seed!r}")

    @property
    def given(self) -> bool:
        """Whether the run trains on the user's data (it names training files)."""
        return bool(self.train_files)


@dataclass(frozen=True)
class RewardConfig:
    """The reward function of a dataset run: ``name`` in the Python file ``path`` (verl's
    ``custom_reward_function.path`` and ``.name``), called as ``name(data_source,
    solution_str, ground_truth, extra_info=None)``; without a path, a built-in (``gsm8k``: a
    final ``#### answer``; ``boxed``: a ``\\boxed{}`` answer; ``compute_score``: either, by
    ``data_source``). Rows are scored ``max_workers`` at a time, each call within
    ``timeout_s``. A call that raises, hangs or returns no number stops the run naming the
    row (``on_error="raise"``), or, opted into with ``on_error="count"``, scores 0.0 and is
    counted in the step's ``reward/failures``."""

    path: str | None = None
    name: str = "compute_score"
    timeout_s: float = 30.0
    max_workers: int = 8
    on_error: OnRewardError = "raise"

    def __post_init__(self) -> None:
        owner = "RewardConfig"
        if self.path is not None and (not isinstance(self.path, str) or not self.path):
            raise TrainerConfigError(f"{owner}.path must be a non-empty str, got {self.path!r}")
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise TrainerConfigError(f"{owner}.name must be a Python name, got {self.name!r}")
        timeout = self.timeout_s
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
            raise TrainerConfigError(f"{owner}.timeout_s must be > 0, got {timeout!r}")
        _positive_int(f"{owner}.max_workers", self.max_workers)
        if self.on_error not in ON_REWARD_ERROR:
            raise TrainerConfigError(
                f"{owner}.on_error must be one of {ON_REWARD_ERROR}, got {self.on_error!r}"
            )


@dataclass(frozen=True)
class TrackingConfig:
    """Where each step's metrics go besides ``metrics.jsonl`` (always written): verl's
    ``trainer.logger``, any of :data:`LOGGERS` (TensorBoard, W&B and MLflow are the extras
    ``sc-trainer[tensorboard]``, ``[wandb]``, ``[mlflow]``), under ``project_name`` and
    ``experiment_name``."""

    logger: tuple[str, ...] = ()
    project_name: str = "sc"
    experiment_name: str = "run"

    def __post_init__(self) -> None:
        owner = "TrackingConfig"
        logger: object = self.logger
        names = (logger,) if isinstance(logger, str) else logger
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise TrainerConfigError(f"{owner}.logger must be a list of names, got {names!r}")
        object.__setattr__(self, "logger", tuple(names))
        for name in ("project_name", "experiment_name"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise TrainerConfigError(f"{owner}.{name} must be a non-empty str, got {value!r}")


#: where :class:`RolloutCorrectionConfig`'s settings live in a config file (verl's section)
ROLLOUT_CORRECTION_KEY = "algorithm.rollout_correction"


@dataclass(frozen=True)
class RolloutCorrectionConfig:
    """Corrections for the mismatch between the sampler and the trainer (verl's
    ``algorithm.rollout_correction``); all off by default.

    ``rollout_is`` ("token", "sequence" or None) weights each token's policy-gradient loss by
    the truncated importance ratio ``min(pi_train / pi_rollout, rollout_is_threshold)``: the
    token's own ratio, or its sequence's product of ratios. ``rollout_rs`` ("token",
    "sequence" or None) drops from the loss the tokens, or whole sequences, whose ratio is
    outside ``[rollout_rs_threshold_lower, rollout_rs_threshold]`` (defaults:
    ``1 / upper`` and ``rollout_is_threshold``). Those bounds also count the out-of-bounds
    fractions of the mismatch metrics (``rollout_corr/*``), which are logged either way."""

    rollout_is: Literal["token", "sequence"] | None = None
    rollout_is_threshold: float = 2.0
    rollout_rs: Literal["token", "sequence"] | None = None
    rollout_rs_threshold: float | None = None
    rollout_rs_threshold_lower: float | None = None

    def __post_init__(self) -> None:
        try:
            _ = self.bounds  # computing them checks the fields
        except ConfigError as err:
            raise TrainerConfigError(str(err)) from None

    @property
    def enabled(self) -> bool:
        """Whether the update is corrected (IS weights or rejection), not only measured."""
        return self.rollout_is is not None or self.rollout_rs is not None

    @property
    def bounds(self) -> tuple[float, float]:
        """``(lower, upper)`` on the ratio pi_train / pi_rollout: rejection's and the
        metrics' bounds."""
        return check_rollout_correction(
            self.rollout_is,
            self.rollout_is_threshold,
            self.rollout_rs,
            self.rollout_rs_threshold,
            self.rollout_rs_threshold_lower,
            where=ROLLOUT_CORRECTION_KEY,
        )
