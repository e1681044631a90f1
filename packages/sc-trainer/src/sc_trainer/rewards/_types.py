"""What a reward scorer takes (one row: :class:`RewardInput`) and what it gives back for a
batch (:class:`RewardOutcome`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["RewardInput", "RewardOutcome"]


@dataclass(frozen=True)
class RewardInput:
    """One row to score, as verl's ``compute_score`` receives it.

    ``data_source`` names the data set the row comes from (``"openai/gsm8k"``), so that one
    function can score several; ``solution_str`` is the decoded response; ``ground_truth``
    is whatever the data set stores as the reference answer (a string, a number, a list);
    ``extra_info`` is the row's extra fields, if any. ``row`` is the row's index in the
    trainer's batch, used in messages and in :attr:`RewardOutcome.failed_rows`; ``None``
    stands for the input's position in the list given to
    :meth:`~sc_trainer.rewards.RewardScorer.score`.
    """

    data_source: str
    solution_str: str
    ground_truth: Any
    extra_info: dict[str, Any] | None = None
    row: int | None = None


@dataclass(frozen=True)
class RewardOutcome:
    """The scores of one batch, in input order.

    ``scores`` holds one float per input. A row whose call failed (only with
    ``on_error="count"``; with ``"raise"`` the batch raises instead) scores ``0.0`` and is
    listed: ``failed_rows`` holds the rows' indices (:attr:`RewardInput.row`, or the position
    when that is ``None``), in input order, and ``failure_messages`` one message each, the
    same text :class:`~sc_trainer.rewards.RewardFunctionError` would carry.

    ``extra`` holds the extra numeric entries of dict results (every key but ``"score"``),
    one list per key with one value per input, keys in the order first seen. A row that has
    no value for a key (it failed, returned a plain number, or a dict without that key or
    with a value there that is not a number) has ``nan`` there: average with
    ``math.fsum`` over the finite values, or ``numpy.nanmean``.
    """

    scores: list[float]
    extra: dict[str, list[float]] = field(default_factory=dict)
    failed_rows: list[int] = field(default_factory=list)
    failure_messages: list[str] = field(default_factory=list)

    @property
    def failures(self) -> int:
        """How many rows failed (scored ``0.0`` in ``on_error="count"`` mode)."""
        return len(self.failed_rows)
