"""Delta messages: only the words that changed since a baseline both sides hold.

A message between one sender and one receiver is a flat ``uint8`` tensor (the packed pieces).
Against the same pair's message of an earlier version (the *baseline*, kept by both sides),
:func:`encode` compares it word by word (a word is the smallest itemsize among the pieces, so
every element is whole words) and returns either the dense message or the positions and new
values of the words that differ, whichever is smaller. :func:`decode` rebuilds the dense
message from the baseline; the result is bit-exact (words are compared as integers, so NaNs
and signed zeros are no exception).
"""

from __future__ import annotations

import torch

from .._errors import WeightSyncError

__all__ = ["DENSE", "SPARSE", "decode", "encode", "word_dtype"]

DENSE, SPARSE = 0, 1
_WORDS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def word_dtype(word: int) -> torch.dtype:
    dtype = _WORDS.get(word)
    if dtype is None:
        raise WeightSyncError(f"weight sync: no word type of {word} bytes")
    return dtype


def encode(
    message: torch.Tensor, baseline: torch.Tensor | None, word: int
) -> tuple[int, torch.Tensor]:
    """``(DENSE, message)`` or ``(SPARSE, payload)``: positions (int32) then new words."""
    if baseline is None or baseline.numel() != message.numel() or message.numel() % word:
        return DENSE, message
    wt = word_dtype(word)
    new, old = message.view(wt), baseline.view(wt)
    where = (new != old).nonzero().flatten()
    sparse_bytes = where.numel() * (4 + word)
    if sparse_bytes >= message.numel() or new.numel() >= 2**31:
        return DENSE, message
    positions = where.to(torch.int32).view(torch.uint8)
    values = new[where].contiguous().view(torch.uint8)
    return SPARSE, torch.cat([positions, values])


def decode(
    mode: int, payload: torch.Tensor, baseline: torch.Tensor | None, word: int, size: int
) -> torch.Tensor:
    """The dense message of ``size`` bytes that :func:`encode` turned into ``payload``."""
    if mode == DENSE:
        return payload
    if baseline is None or baseline.numel() != size:
        raise WeightSyncError(
            "weight sync: a delta message arrived without the baseline it was computed against"
        )
    count = payload.numel() // (4 + word)
    positions = payload[: 4 * count].view(torch.int32).long()
    values = payload[4 * count :].clone().view(word_dtype(word))  # clone: word-aligned
    out = baseline.clone()
    out.view(word_dtype(word))[positions] = values
    return out
