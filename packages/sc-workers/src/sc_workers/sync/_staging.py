"""Packing pieces into one message per (sender, receiver) pair, and the receiver's staging.

A sender packs the bytes of every piece it owes one receiver, in plan order, into one flat
``uint8`` tensor (one message, whatever the pieces' dtypes). The receiver unpacks them into
:class:`StagedWeights`: a private copy of each of its parameters for the incoming version,
filled piece by piece and checked complete (every element written exactly once, counted).
Only :meth:`StagedWeights.commit` touches the live parameters, so generation never sees a mix
of versions, and a failed sync leaves them as they were.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from .._errors import WeightSyncError
from ._layout import Region, local_view
from ._plan import Piece

__all__ = ["StagedWeights", "pack_pieces", "unpack_pieces"]


def pack_pieces(
    pieces: Sequence[Piece], held: Mapping[str, tuple[torch.Tensor, Region]]
) -> torch.Tensor:
    """The bytes of ``pieces``, concatenated in order, from this sender's ``held`` tensors
    (``name -> (local tensor, the region it holds)``)."""
    parts = []
    for piece in pieces:
        tensor, region = held[piece.name]
        part = tensor[piece.region.within(region)].detach().contiguous().reshape(-1)
        parts.append(part.view(torch.uint8))
    if not parts:
        return torch.empty(0, dtype=torch.uint8)
    return torch.cat(parts)


class StagedWeights:
    """The incoming version of one receiver's parameters, filled before it is applied.

    ``targets`` maps each parameter name to ``(live local tensor, the region it holds)``; the
    staging copies have the live tensors' shapes, dtypes and device.
    """

    def __init__(
        self, version: int, rank: int, targets: Mapping[str, tuple[torch.Tensor, Region]]
    ) -> None:
        self.version = version
        self.rank = rank
        self._targets = dict(targets)
        self.buffers = {
            name: torch.empty_like(tensor.detach()) for name, (tensor, _) in targets.items()
        }
        self._filled = dict.fromkeys(targets, 0)
        self.bytes_received = 0

    def fill(self, piece: Piece, data: torch.Tensor, source_dtype: torch.dtype) -> None:
        """Write one piece (its bytes in ``data``, laid out in ``source_dtype``)."""
        target = self._targets.get(piece.name)
        if target is None:
            raise WeightSyncError(
                f"weight sync v{self.version}: rank {self.rank} got a piece of {piece.name!r}, "
                "which it does not hold",
                rank=self.rank,
                version=self.version,
            )
        _, region = target
        if piece.region.intersect(region) != piece.region:
            raise WeightSyncError(
                f"weight sync v{self.version}: rank {self.rank} got region {piece.region} of "
                f"{piece.name!r}, outside the {region} it holds",
                rank=self.rank,
                version=self.version,
            )
        values = data.view(source_dtype).reshape(piece.region.shape)
        self.buffers[piece.name][piece.region.within(region)].copy_(values)
        self._filled[piece.name] += piece.region.numel
        self.bytes_received += data.numel()

    def check_complete(self) -> None:
        """Every element of every staged tensor was written (counted), else WeightSyncError."""
        for name, (tensor, _) in self._targets.items():
            if self._filled[name] != tensor.numel():
                raise WeightSyncError(
                    f"weight sync v{self.version}: rank {self.rank} received "
                    f"{self._filled[name]} of the {tensor.numel()} elements of {name!r}",
                    rank=self.rank,
                    version=self.version,
                )

    @torch.no_grad()
    def commit(self) -> None:
        """Copy the staged version into the live parameters (after :meth:`check_complete`)."""
        self.check_complete()
        for name, (tensor, _) in self._targets.items():
            tensor.copy_(self.buffers[name])


def unpack_pieces(
    staged: StagedWeights,
    pieces: Sequence[Piece],
    message: torch.Tensor,
    source_dtypes: Mapping[str, torch.dtype],
) -> None:
    """Fill ``staged`` from one message holding ``pieces`` in order."""
    expected = sum(p.nbytes for p in pieces)
    if message.numel() != expected:
        raise WeightSyncError(
            f"weight sync v{staged.version}: rank {staged.rank} got a message of "
            f"{message.numel()} bytes for pieces of {expected}",
            rank=staged.rank,
            version=staged.version,
        )
    at = 0
    for piece in pieces:
        staged.fill(piece, message[at : at + piece.nbytes], source_dtypes[piece.name])
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
