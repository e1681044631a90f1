"""Packing pieces, and the receiver's staging of an incoming version.

A sender packs the bytes of pieces, in plan order, into one flat ``uint8`` tensor (whatever
the pieces' dtypes), copying each piece once, straight into its place (a buffer reused from
sync to sync when the caller keeps it).

A receiver stages the incoming version in :class:`StagedWeights`: a second set of tensors
shaped like its live parameters (reused from sync to sync), filled either straight off the
wire or by unpacking messages, and checked complete (every element of every parameter covered
exactly once, counted). The live parameters are untouched until :meth:`StagedWeights.commit`,
which switches each of them to its staged storage (a pointer swap, no copy; the old storage
becomes the staging space of the next sync), so generation never sees a mix of versions and a
failed sync leaves them as they were.
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
    """The incoming version of one receiver's parameters, staged beside the live ones.

    ``targets`` maps each parameter name to ``(live local tensor, the region it holds)``;
    ``spare`` (what an earlier :meth:`commit` returned) is reused as the staging space where a
    tensor of the same shape, dtype and device is there.
    """

    def __init__(
        self,
        version: int,
        rank: int,
        targets: Mapping[str, tuple[torch.Tensor, Region]],
        spare: Mapping[str, torch.Tensor] | None = None,
    ) -> None:
        self.version = version
        self.rank = rank
        self._targets = dict(targets)
        self._filled = dict.fromkeys(targets, 0)
        self._staging = {
            name: _reuse((spare or {}).get(name), live) for name, (live, _) in targets.items()
        }
        self.bytes_received = 0

    def _error(self, message: str) -> WeightSyncError:
        return WeightSyncError(
            f"weight sync v{self.version}: rank {self.rank} {message}",
            rank=self.rank,
            version=self.version,
            group="rollout",
        )

    def expect(self, pieces: Sequence[Piece]) -> None:
        """Count ``pieces`` as coming to this rank (checked against what it holds)."""
        for piece in pieces:
            target = self._targets.get(piece.name)
            if target is None:
                raise self._error(f"got a piece of {piece.name!r}, which it does not hold")
            if piece.region.intersect(target[1]) != piece.region:
                raise self._error(
                    f"got region {piece.region} of {piece.name!r}, outside the {target[1]} it holds"
                )
            self._filled[piece.name] += piece.region.numel
            self.bytes_received += piece.nbytes

    def slot(self, piece: Piece) -> torch.Tensor:
        """Where ``piece`` goes in the staging space (a view)."""
        return self._staging[piece.name][piece.region.within(self._targets[piece.name][1])]

    def staging(self, name: str) -> tuple[torch.Tensor, Region]:
        """The staging tensor of ``name`` and the region it holds."""
        return self._staging[name], self._targets[name][1]

    @torch.no_grad()
    def unpack(
        self,
        pieces: Sequence[Piece],
        message: torch.Tensor,
        source_dtypes: Mapping[str, torch.dtype],
    ) -> None:
        """Copy ``pieces`` (packed in order in ``message``, in the source's dtypes) into their
        slots (already :meth:`expect`-ed)."""
        at = 0
        for piece in pieces:
            dtype = source_dtypes[piece.name]
            raw = message[at : at + piece.nbytes]
            if at % dtype.itemsize:  # after a piece of a smaller dtype: realign
                raw = raw.clone()
            self.slot(piece).copy_(raw.view(dtype).view(piece.region.shape))
            at += piece.nbytes

    def add(
        self,
        pieces: Sequence[Piece],
        message: torch.Tensor,
        source_dtypes: Mapping[str, torch.dtype],
    ) -> None:
        """:meth:`expect` ``pieces`` and :meth:`unpack` them from one ``message``."""
        expected = sum(p.nbytes for p in pieces)
        if message.numel() != expected:
            raise self._error(f"got a message of {message.numel()} bytes for pieces of {expected}")
        self.expect(pieces)
        self.unpack(pieces, message, source_dtypes)

    def check_complete(self) -> None:
        """Every element of every target is covered (counted), else WeightSyncError."""
        for name, (tensor, _) in self._targets.items():
            if self._filled[name] != tensor.numel():
                raise self._error(
                    f"received {self._filled[name]} of the {tensor.numel()} elements of {name!r}"
                )

    @torch.no_grad()
    def commit(self) -> dict[str, torch.Tensor]:
        """Switch the live parameters to the staged version (after :meth:`check_complete`).

        A live tensor that owns its storage (the usual case) takes the staged storage, no
        copy; any other (a view into a larger buffer) gets the staged values copied in.
        Returns the spare space for the next sync's ``spare``."""
        if self._targets and not self._staging:
            raise self._error("committed this version already")
        self.check_complete()
        spare = {}
        for name, (live, _) in self._targets.items():
            staged = self._staging[name]
            if _owns_storage(live):
                old = torch.empty(0, dtype=live.dtype, device=live.device)
                old.set_(live.untyped_storage(), 0, live.shape, live.stride())
                live.set_(staged.untyped_storage(), 0, staged.shape, staged.stride())
                spare[name] = old
            else:
                live.copy_(staged)
                spare[name] = staged
        self._staging = {}
        return spare


def _reuse(spare: torch.Tensor | None, live: torch.Tensor) -> torch.Tensor:
    if (
        spare is not None
        and spare.shape == live.shape
        and spare.dtype == live.dtype
        and spare.device == live.device
        and spare.is_contiguous()
    ):
        return spare
    return torch.empty(live.shape, dtype=live.dtype, device=live.device)


def _owns_storage(tensor: torch.Tensor) -> bool:
    """The tensor is its storage, whole and contiguous (not a view into a larger buffer)."""
    return bool(
        tensor._base is None
        and tensor.is_contiguous()
        and tensor.storage_offset() == 0
        and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )


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
