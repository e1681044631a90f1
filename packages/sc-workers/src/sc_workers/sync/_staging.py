"""Packing pieces into one message per (sender, receiver) pair, and the receiver's staging.

A sender packs the bytes of every piece it owes one receiver, in plan order, into one flat
``uint8`` tensor (one message, whatever the pieces' dtypes), copying each piece once, straight
into its place in the message (a buffer reused from sync to sync when the caller keeps it).
The receiver keeps the messages as they arrived in :class:`StagedWeights`: the incoming
version, checked complete (every element of every parameter covered exactly once, counted)
but not applied. Only :meth:`StagedWeights.commit` writes the live parameters, each element
copied once from its message, so generation never sees a mix of versions and a failed sync
leaves them as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from .._errors import WeightSyncError
from ._layout import Region, local_view
from ._plan import Piece

__all__ = ["StagedWeights", "held_tensors", "pack_pieces"]


def pack_pieces(
    pieces: Sequence[Piece],
    held: Mapping[str, tuple[torch.Tensor, Region]],
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The bytes of ``pieces``, concatenated in order, from this sender's ``held`` tensors
    (``name -> (local tensor, the region it holds)``); written into ``out`` when it is a
    ``uint8`` tensor of the right size, else into a new one."""
    total = sum(p.nbytes for p in pieces)
    first = next(iter(held.values()))[0] if held else None
    device = first.device if first is not None else torch.device("cpu")
    if out is None or out.numel() != total or out.dtype != torch.uint8 or out.device != device:
        out = torch.empty(total, dtype=torch.uint8, device=device)
    at = 0
    with torch.no_grad():
        for piece in pieces:
            tensor, region = held[piece.name]
            values = tensor[piece.region.within(region)]
            slot = out[at : at + piece.nbytes]
            if at % tensor.element_size() == 0:  # aligned: copy straight into place
                slot.view(tensor.dtype).view(piece.region.shape).copy_(values)
            else:  # after a piece of a smaller dtype: through a contiguous copy
                slot.copy_(values.contiguous().view(-1).view(torch.uint8))
            at += piece.nbytes
    return out


class StagedWeights:
    """The incoming version of one receiver's parameters: the messages that carry it, checked
    complete, applied by :meth:`commit`.

    ``targets`` maps each parameter name to ``(live local tensor, the region it holds)``.
    """

    def __init__(
        self, version: int, rank: int, targets: Mapping[str, tuple[torch.Tensor, Region]]
    ) -> None:
        self.version = version
        self.rank = rank
        self._targets = dict(targets)
        self._filled = dict.fromkeys(targets, 0)
        self._messages: list[tuple[Sequence[Piece], torch.Tensor, Mapping[str, torch.dtype]]] = []
        self.bytes_received = 0

    def _error(self, message: str) -> WeightSyncError:
        return WeightSyncError(
            f"weight sync v{self.version}: rank {self.rank} {message}",
            rank=self.rank,
            version=self.version,
        )

    def add(
        self,
        pieces: Sequence[Piece],
        message: torch.Tensor,
        source_dtypes: Mapping[str, torch.dtype],
    ) -> None:
        """Keep one message holding ``pieces`` in order (checked against the targets)."""
        expected = sum(p.nbytes for p in pieces)
        if message.numel() != expected:
            raise self._error(f"got a message of {message.numel()} bytes for pieces of {expected}")
        for piece in pieces:
            target = self._targets.get(piece.name)
            if target is None:
                raise self._error(f"got a piece of {piece.name!r}, which it does not hold")
            if piece.region.intersect(target[1]) != piece.region:
                raise self._error(
                    f"got region {piece.region} of {piece.name!r}, outside the {target[1]} it holds"
                )
            self._filled[piece.name] += piece.region.numel
        self._messages.append((pieces, message, source_dtypes))
        self.bytes_received += int(message.numel())

    def check_complete(self) -> None:
        """Every element of every target is covered (counted), else WeightSyncError."""
        for name, (tensor, _) in self._targets.items():
            if self._filled[name] != tensor.numel():
                raise self._error(
                    f"received {self._filled[name]} of the {tensor.numel()} elements of {name!r}"
                )

    @torch.no_grad()
    def commit(self) -> None:
        """Write the staged version into the live parameters (after :meth:`check_complete`)."""
        self.check_complete()
        for pieces, message, dtypes in self._messages:
            at = 0
            for piece in pieces:
                tensor, region = self._targets[piece.name]
                dtype = dtypes[piece.name]
                raw = message[at : at + piece.nbytes]
                if at % dtype.itemsize:  # after a piece of a smaller dtype: realign
                    raw = raw.clone()
                values = raw.view(dtype).view(piece.region.shape)
                tensor[piece.region.within(region)].copy_(values)
                at += piece.nbytes


def held_tensors(
    module: nn.Module, regions: Mapping[str, Region]
) -> dict[str, tuple[torch.Tensor, Region]]:
    """``name -> (local tensor, region)`` for the parameters of ``module`` named in
    ``regions`` (this rank's part of a :class:`~sc_workers.sync.ModelLayout`)."""
    out = {}
    for name, param in module.named_parameters():
        region = regions.get(name)
        if region is not None:
            out[name] = (local_view(param), region)
    return out
