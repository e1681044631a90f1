"""Making the reward function fail on purpose: ``reward:P@step=N[:raise|hang]``.

A run that scores with a reward function (``data.train_files`` and
``custom_reward_function``) can test what its reward's failures do to it: at step ``N``, the
call that scores row ``P`` of the step's batch (its position, 0 to ``rows_per_step - 1``)
raises (``raise``, the default) or blocks past the reward's deadline (``hang``: it sleeps
``timeout_s`` plus a margin, then returns). Every other call, and every call of every other
step, is the user's function unchanged. What follows is the reward's business, as for a
real failure: the run stops with :class:`~sc_trainer.rewards.RewardFunctionError` naming
the row (``on_error="raise"``), or the row scores 0.0 and ``reward/failures`` counts it
(``on_error="count"``). Each fault fires once.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from .._errors import TrainerConfigError
from ..rewards import RewardInput
from ..rewards._calling import accepts_extra_info
from ._workers import REWARD_PREFIX

__all__ = ["REWARD_ACTIONS", "RewardFault", "RewardFaults", "is_reward_fault"]

logger = logging.getLogger(__name__)

RewardAction = Literal["raise", "hang"]
#: What an injected reward fault does to its call.
REWARD_ACTIONS: tuple[RewardAction, ...] = ("raise", "hang")

_SPEC = re.compile(r"^reward:(?P<position>\d+)@step=(?P<step>\d+)(?::(?P<action>[a-z]+))?$")
_GRAMMAR = "reward:POSITION@step=N[:raise|hang], e.g. 'reward:3@step=2:hang'"
# The key under which a row's extra_info carries its injected fault to the wrapped function.
_MARK = "__sc_injected_reward_fault__"
# How much longer than the deadline a hanging call sleeps (then it returns, so that its
# thread ends).
_HANG_MARGIN_S = 5.0


class InjectedRewardError(RuntimeError):
    """What an injected ``raise`` fault raises inside the reward call (the scorer reports it
    as the row's failure, as it does the user's own errors)."""


def is_reward_fault(text: str) -> bool:
    """Whether one comma-separated part of ``inject_fault`` is a reward fault."""
    return text.strip().startswith(REWARD_PREFIX)


@dataclass(frozen=True)
class RewardFault:
    """Make the reward call of row ``position`` of step ``step``'s batch ``action``."""

    position: int
    step: int
    action: RewardAction = "raise"

    def __post_init__(self) -> None:
        if self.position < 0 or self.step < 1:
            raise TrainerConfigError(
                f"inject_fault: a reward fault's position must be >= 0 and its step >= 1, "
                f"got position {self.position}, step {self.step}"
            )
        if self.action not in REWARD_ACTIONS:
            raise TrainerConfigError(
                f"inject_fault: a reward fault's action must be one of {REWARD_ACTIONS}, "
                f"got {self.action!r}"
            )

    @classmethod
    def parse_all(cls, text: str | None) -> tuple[RewardFault, ...]:
        """The ``reward:...`` parts of an ``inject_fault`` value (comma-separated)."""
        if text is None:
            return ()
        faults = []
        for part in text.split(","):
            if not is_reward_fault(part):
                continue
            match = _SPEC.match(part.strip())
            if match is None:
                raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {part!r}")
            action = match["action"] or "raise"
            if action not in REWARD_ACTIONS:
                raise TrainerConfigError(
                    f"inject_fault {part.strip()!r}: a reward fault's action must be one of "
                    f"{REWARD_ACTIONS}, got {action!r}"
                )
            faults.append(
                cls(int(match["position"]), int(match["step"]), cast(RewardAction, action))
            )
        return tuple(faults)

    def __str__(self) -> str:
        return f"reward:{self.position}@step={self.step}:{self.action}"


class RewardFaults:
    """The reward faults of one run: :meth:`wrap` the reward function once, :meth:`arm` the
    faults of a step as it begins, and :meth:`apply` them to the next batch of rows scored
    (the step's training batch), each fault once."""

    def __init__(self, faults: Sequence[RewardFault], timeout_s: float) -> None:
        self.faults = tuple(faults)
        self._timeout_s = timeout_s
        self._armed: list[RewardFault] = []
        self._fired: set[RewardFault] = set()

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn``, called as the scorer calls it, except on a row :meth:`apply` marked."""
        passes_extra = accepts_extra_info(fn)
        timeout_s = self._timeout_s

        def reward_with_faults(
            data_source: str,
            solution_str: str,
            ground_truth: Any,
            extra_info: dict[str, Any] | None = None,
        ) -> Any:
            if isinstance(extra_info, dict) and _MARK in extra_info:
                action, extra_info = extra_info[_MARK], extra_info["extra_info"]
                if action == "raise":
                    raise InjectedRewardError("injected fault: the reward function raised")
                time.sleep(timeout_s + _HANG_MARGIN_S)  # past the deadline: a hang
            keywords: dict[str, Any] = {
                "data_source": data_source,
                "solution_str": solution_str,
                "ground_truth": ground_truth,
            }
            if passes_extra:
                keywords["extra_info"] = extra_info
            return fn(**keywords)

        reward_with_faults.__qualname__ = getattr(fn, "__qualname__", "reward_with_faults")
        return reward_with_faults

    def arm(self, step: int) -> None:
        """Arm the faults of ``step`` (as it begins)."""
        self._armed = [f for f in self.faults if f.step == step and f not in self._fired]

    def apply(self, rows: list[RewardInput]) -> list[RewardInput]:
        """``rows`` with the armed faults' rows marked for the wrapped function; disarms.
        A fault whose position is past the batch's rows raises :class:`TrainerConfigError`."""
        armed, self._armed = self._armed, []
        if not armed:
            return rows
        marked = list(rows)
        for fault in armed:
            if fault.position >= len(rows):
                raise TrainerConfigError(
                    f"inject_fault {fault}: position {fault.position} is outside the "
                    f"{len(rows)} rows of step {fault.step}'s batch"
                )
            self._fired.add(fault)
            row = marked[fault.position]
            logger.warning(
                "step %d: injecting the fault %s into the reward call of row %s",
                fault.step,
                fault,
                row.row,
            )
            mark = {_MARK: fault.action, "extra_info": row.extra_info}
            marked[fault.position] = dataclasses.replace(row, extra_info=mark)
        return marked
