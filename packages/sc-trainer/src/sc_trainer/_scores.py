"""What scoring a batch gives: :class:`BatchScores` (a leaf module every task shares).

No ``from __future__ import annotations`` here: a ``NamedTuple``'s annotations stay objects,
so they resolve wherever the class is exported from."""

from typing import Any, NamedTuple

import torch

__all__ = ["BatchScores"]


class BatchScores(NamedTuple):
    """The reward of a generated batch: ``token_scores`` ``[rows, response_length]`` (each
    row's reward on the tokens it is paid on, 0 elsewhere) and the reward's own metrics
    (``reward/*``: a reward function's extra values, failures counted), empty for a task
    that has none."""

    token_scores: torch.Tensor
    metrics: dict[str, Any]
