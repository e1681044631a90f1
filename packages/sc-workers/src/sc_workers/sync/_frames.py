"""Frames: how the pieces of one (sender, receiver) pair go on the wire in a dense sync.

Both sides cut a pair's pieces (in plan order) into the same frames, from sizes alone: a piece
of at least ``frame_bytes`` is a frame of its own, smaller pieces are batched until a frame
reaches ``frame_bytes``. Each frame is one message, tagged with its index in the pair. So a
model of thousands of small tensors still makes few messages, while a large piece can travel
without any copy: a sender sends it straight from its tensor when the piece is contiguous
there, and a receiver receives it straight into its staging tensor when the piece is
contiguous there (and the dtypes agree). Only the other frames are packed (sender) or
unpacked (receiver), and a sender packs frame ``k + 1`` while frame ``k`` is on the wire.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from ._layout import Region
from ._plan import Piece

__all__ = ["FRAME_BYTES", "Frame", "align", "contiguous_bytes", "frames_of"]

FRAME_BYTES = 1 << 20
_ALIGN = 16  # packed frames start at multiples of this in their buffer (any dtype views it)


class Frame(NamedTuple):
    """Consecutive ``pieces`` of one pair, ``nbytes`` in all; ``tag`` is its index in the
    pair."""

    tag: int
    pieces: tuple[Piece, ...]
    nbytes: int


def frames_of(pieces: Sequence[Piece], frame_bytes: int = FRAME_BYTES) -> list[Frame]:
    """The frames of one pair's ``pieces`` (the same on both sides)."""
    out: list[Frame] = []
    run: list[Piece] = []
    size = 0

    def flush() -> None:
        nonlocal run, size
        if run:
            out.append(Frame(len(out), tuple(run), size))
            run, size = [], 0

    for piece in pieces:
        if piece.nbytes >= frame_bytes:
            flush()
            out.append(Frame(len(out), (piece,), piece.nbytes))
            continue
        run.append(piece)
        size += piece.nbytes
        if size >= frame_bytes:
            flush()
    flush()
    return out


def align(offset: int) -> int:
    """``offset`` rounded up to the start of the next packed frame."""
    return -(-offset // _ALIGN) * _ALIGN


def contiguous_bytes(tensor: torch.Tensor, held: Region, piece: Region) -> torch.Tensor | None:
    """The bytes of ``piece`` inside ``tensor`` (which holds ``held``) as a flat ``uint8``
    view, when they are one contiguous run of memory; else ``None`` (the piece is packed)."""
    view = tensor[piece.within(held)]
    if not view.is_contiguous():
        return None
    return view.reshape(-1).view(torch.uint8)
