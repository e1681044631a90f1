"""The exact mode's forward: each sequence alone, in a window of a fixed width.

A model's output for one token depends, bit for bit, on more than the tokens before it: on
how many rows share the forward, how much padding sits before the sequence and how long the
forward is (the shapes pick the matrix-multiply blocking and the reduction order). So the
sampler, which sees a sequence grow one token at a time beside other requests, and the
trainer, which recomputes whole rows in micro-batches, agree only to a few units in the last
place. :func:`window_forward` removes every one of those differences: each row runs alone
(batch 1), its real tokens moved to the start of a row of ``window`` tokens (positions
``0..n-1``), the rest padding that no real token attends to. Causal attention then makes the
output at a real token a function of that token's prefix alone, computed with the same
shapes whether the prefix is all there is (the sampler) or the rest of the sequence follows
(the trainer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._errors import BatchError

__all__ = ["Forward", "rows_forward", "window_forward", "window_row"]

#: ``forward(input_ids, attention_mask, position_ids)``: a model's (or an engine's) forward
Forward = Callable[[Tensor, Tensor, Tensor], Tensor]


def window_row(tokens: Sequence[int], window: int, where: str) -> tuple[Tensor, Tensor, Tensor]:
    """One sequence as a row of ``window`` tokens: ``(input_ids, attention_mask,
    position_ids)``, each ``[1, window]``: the tokens first, at positions ``0..n-1``, then
    padding (token 0, mask 0, position 0)."""
    n = len(tokens)
    _check_width(n, window, where)
    ids = torch.zeros((1, window), dtype=torch.long)
    mask = torch.zeros((1, window), dtype=torch.long)
    positions = torch.zeros((1, window), dtype=torch.long)
    ids[0, :n] = torch.as_tensor(list(tokens), dtype=torch.long)
    mask[0, :n] = 1
    positions[0, :n] = torch.arange(n)
    return ids, mask, positions


def window_forward(
    forward: Forward,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    window: int,
    where: str,
) -> Tensor:
    """``forward`` over ``[b, s]`` rows (left padding, then the sequence, then right
    padding), one row at a time in a ``window``-token row that starts at the row's first real
    token; the outputs (``[b, s, ...]``) are put back in the rows' own layout, those of the
    left padding being zeros. Autograd flows through (the policy update uses it).

    Raises :class:`BatchError` when a row is wider than ``window`` from its first real token.
    """
    if window < 1:
        raise BatchError(f"{where}: the exact mode's window must be >= 1 token, got {window}")
    b, s = input_ids.shape
    # the leading padding of each row (0 for a row with no real token)
    firsts = attention_mask.bool().int().argmax(dim=1)
    outputs: list[Tensor] = []
    for row in range(b):
        first = int(firsts[row])
        n = s - first
        _check_width(n, window, where)
        pad = window - n
        ids = _right_padded(input_ids[row : row + 1, first:], pad)
        mask = _right_padded(attention_mask[row : row + 1, first:], pad)
        positions = _right_padded(position_ids[row : row + 1, first:], pad)
        out = forward(ids, mask, positions)[:, :n]
        if first:
            out = torch.cat([out.new_zeros((1, first, *out.shape[2:])), out], dim=1)
        outputs.append(out)
    return torch.cat(outputs)


def rows_forward(
    forward: Forward,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
    exact_window: int,
    where: str,
) -> Tensor:
    """``forward`` over the rows: batched, or in the exact mode (``exact_window`` > 0) each
    row alone in its window (:func:`window_forward`). The one switch the sampler and the
    actor's recomputation and update share, so that they run the same computation."""
    if exact_window:
        return window_forward(forward, input_ids, attention_mask, position_ids, exact_window, where)
    return forward(input_ids, attention_mask, position_ids)


def _right_padded(t: Tensor, pad: int) -> Tensor:
    if not pad:
        return t
    return torch.cat([t, t.new_zeros((t.shape[0], pad))], dim=1)


def _check_width(n: int, window: int, where: str) -> None:
    if n > window:
        raise BatchError(
            f"{where}: a sequence of {n} tokens does not fit the exact mode's window of "
            f"{window} tokens (exact_window); raise it to at least the prompt width plus the "
            "response length"
        )
