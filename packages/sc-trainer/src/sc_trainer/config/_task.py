"""The shape of a run's task: which built-in task, how long its prompts, how many held out."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from .._errors import TaskError
from ._options import option

__all__ = ["TASK_MODES", "TaskConfig", "TaskMode"]

TaskMode = Literal["reverse", "copy", "tool-calc"]
TASK_MODES: tuple[TaskMode, ...] = get_args(TaskMode)

_MAX_LENGTH = 5


@dataclass(frozen=True)
class TaskConfig:
    """Shape of the toy task.

    Attributes:
        length: digits per prompt (1 to 5); the response has as many tokens.
        num_val: strings held out for validation; the rest (``10**length - num_val``) train.
        split_seed: seed of the train/validation split (fixed, independent of the run seed,
            so that two runs with different seeds are validated on the same strings).
        mode: ``"reverse"`` (answer the digits backwards) or ``"copy"`` (answer them as
            they are; easier: every answer token sits at the same distance from its source);
            ``"tool-calc"`` is another task, multi-turn: multiply two 2-digit numbers with a
            calculator tool (:class:`~sc_trainer.tasks.ToolCalcTask`; ``length`` and
            ``num_val`` do not apply).
    """

    length: int = field(default=4, metadata=option(group="training", help="digits per prompt"))
    num_val: int = 256
    split_seed: int = 1234
    mode: TaskMode = field(
        default="reverse",
        metadata=option(
            group="training",
            flags=("--task",),
            help="answer the digits reversed, or copied; tool-calc: multiply two 2-digit "
            "numbers in agent sessions with a calculator tool the policy learns to call (on "
            "engine servers: implies --rollout builtin)",
        ),
    )

    def __post_init__(self) -> None:
        if self.mode not in TASK_MODES:
            raise TaskError(f"TaskConfig.mode must be one of {TASK_MODES}, got {self.mode!r}")
        if not 1 <= self.length <= _MAX_LENGTH:
            raise TaskError(f"TaskConfig.length must be in 1..{_MAX_LENGTH}, got {self.length}")
        total = 10**self.length
        if not 1 <= self.num_val <= total // 2:
            raise TaskError(
                f"TaskConfig.num_val must be in 1..{total // 2} (half of the {total} strings of "
                f"length {self.length}), got {self.num_val}"
            )
