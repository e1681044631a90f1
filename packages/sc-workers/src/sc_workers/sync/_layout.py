"""Where each rank's piece of each parameter sits in the full tensor.

A :class:`Region` is a box of a full tensor (an offset and a shape per dimension). A
:class:`ModelLayout` says, for every rank of a group, which region of every parameter it holds
(nothing, a shard, or the whole tensor): FSDP2 shards dim 0 over dp, tensor parallelism splits
a dimension over tp, replicas hold the same regions. Layouts are built from the live modules
(:func:`module_regions` on each rank, gathered by the driver) or by hand in tests, so any mix of
FSDP2, tensor parallel and replicated parameters describes itself the same way.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from .._errors import SyncLayoutError

__all__ = ["ModelLayout", "Region", "module_regions"]


@dataclass(frozen=True, eq=False)
class Region:
    """The box ``[offset[d], offset[d] + shape[d])`` of every dimension ``d`` of a tensor.

    Equal boxes compare and hash equal (the hash is computed once: plans hash many)."""

    offset: tuple[int, ...]
    shape: tuple[int, ...]

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Region):
            return NotImplemented
        return self.offset == other.offset and self.shape == other.shape

    def __hash__(self) -> int:
        cached: int | None = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((self.offset, self.shape))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __post_init__(self) -> None:
        if len(self.offset) != len(self.shape):
            raise SyncLayoutError(
                f"Region: offset {self.offset} and shape {self.shape} differ in rank"
            )
        if any(o < 0 for o in self.offset) or any(s < 0 for s in self.shape):
            raise SyncLayoutError(
                f"Region: offset {self.offset} and shape {self.shape} must be >= 0"
            )

    @classmethod
    def full(cls, shape: Sequence[int]) -> Region:
        return cls((0,) * len(shape), tuple(int(s) for s in shape))

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    def intersect(self, other: Region) -> Region | None:
        """The common box of two regions of the same tensor (``None`` if empty)."""
        offset, shape = [], []
        for a, n, b, m in zip(self.offset, self.shape, other.offset, other.shape, strict=True):
            lo, hi = max(a, b), min(a + n, b + m)
            if hi <= lo:
                return None
            offset.append(lo)
            shape.append(hi - lo)
        return Region(tuple(offset), tuple(shape))

    def within(self, outer: Region) -> tuple[slice, ...]:
        """This region as slices of a tensor that holds ``outer`` (which must contain it)."""
        return tuple(
            slice(o - p, o - p + s)
            for o, s, p in zip(self.offset, self.shape, outer.offset, strict=True)
        )

    def inside(self, shape: Sequence[int]) -> bool:
        return len(shape) == len(self.shape) and all(
            o + s <= n for o, s, n in zip(self.offset, self.shape, shape, strict=True)
        )


@dataclass(frozen=True)
class ModelLayout:
    """The regions every rank of a group holds, for every parameter.

    ``shapes[name]`` is the full shape and ``dtypes[name]`` the dtype name (``"float32"``);
    ``ranks[r][name]`` the region rank ``r`` holds (absent: none). Validated on construction:
    every region lies inside its tensor, and the distinct regions of a parameter are either
    disjoint and cover it exactly (a *source* layout, :meth:`check_covers`), or at least lie
    inside it (a destination may hold only part, or several copies, of a tensor).
    """

    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]
    ranks: tuple[Mapping[str, Region], ...]

    def __post_init__(self) -> None:
        if set(self.shapes) != set(self.dtypes):
            raise SyncLayoutError(
                f"ModelLayout: shapes and dtypes name different tensors "
                f"({sorted(set(self.shapes) ^ set(self.dtypes))[:5]})"
            )
        for rank, held in enumerate(self.ranks):
            for name, region in held.items():
                shape = self.shapes.get(name)
                if shape is None:
                    raise SyncLayoutError(f"ModelLayout: rank {rank} holds unknown tensor {name!r}")
                if not region.inside(shape):
                    raise SyncLayoutError(
                        f"ModelLayout: rank {rank}'s region {region} of {name!r} lies outside "
                        f"its shape {shape}"
                    )

    @classmethod
    def from_ranks(cls, reports: Sequence[Mapping[str, Any]]) -> ModelLayout:
        """A layout from each rank's :func:`module_regions` report (rank order); the ranks
        must agree on every tensor's full shape and dtype."""
        shapes: dict[str, tuple[int, ...]] = {}
        dtypes: dict[str, str] = {}
        ranks: list[dict[str, Region]] = []
        interned: dict[tuple[tuple[int, ...], tuple[int, ...]], Region] = {}
        for rank, report in enumerate(reports):
            held: dict[str, Region] = {}
            for name, (shape, dtype, offset, local) in report.items():
                shape = tuple(int(s) for s in shape)
                if (
                    shapes.setdefault(name, shape) != shape
                    or dtypes.setdefault(name, dtype) != dtype
                ):
                    raise SyncLayoutError(
                        f"ModelLayout: rank {rank} reports {name!r} as {shape} {dtype}, another "
                        f"rank as {shapes[name]} {dtypes[name]}"
                    )
                box = (tuple(int(o) for o in offset), tuple(int(s) for s in local))
                region = interned.get(box)
                if region is None:
                    region = interned[box] = Region(*box)
                if region.numel:
                    held[name] = region
            ranks.append(held)
        return cls(shapes, dtypes, tuple(ranks))

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    def nbytes(self, name: str, region: Region) -> int:
        return region.numel * _itemsize(self.dtypes[name])

    def distinct_regions(self, name: str) -> dict[Region, list[int]]:
        """The distinct regions of ``name`` and the ranks holding each (its replicas)."""
        out: dict[Region, list[int]] = {}
        for rank, held in enumerate(self.ranks):
            region = held.get(name)
            if region is not None:
                out.setdefault(region, []).append(rank)
        return out

    def check_covers(self, owner: str, names: Iterable[str] | None = None) -> None:
        """Every tensor's (or those in ``names``) distinct regions are disjoint and cover it
        exactly (what a layout that sends weights must satisfy), else
        :class:`SyncLayoutError`."""
        for name in self.shapes if names is None else names:
            shape = self.shapes[name]
            regions = list(self.distinct_regions(name))
            total = sum(r.numel for r in regions)
            if total != math.prod(shape):
                raise SyncLayoutError(
                    f"{owner}: the ranks hold {total} distinct elements of {name!r}, which has "
                    f"{math.prod(shape)} (shape {shape}): the layout does not cover it exactly"
                )
            for i, a in enumerate(regions):
                for b in regions[i + 1 :]:
                    if a.intersect(b) is not None:
                        raise SyncLayoutError(
                            f"{owner}: regions {a} and {b} of {name!r} overlap without being "
                            "replicas of each other"
                        )


def _itemsize(dtype: str) -> int:
    value = getattr(torch, dtype, None)
    if not isinstance(value, torch.dtype):
        raise SyncLayoutError(f"ModelLayout: unknown dtype {dtype!r}")
    return value.itemsize


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def local_view(param: Any) -> torch.Tensor:
    """The tensor a rank holds for ``param``: a DTensor's own local shard (the object itself,
    not a view of it, so a commit that switches its storage reaches the parameter), else
    ``param``."""
    local: torch.Tensor | None = getattr(param, "_local_tensor", None)
    if local is None:
        to_local = getattr(param, "to_local", None)
        local = param if to_local is None else to_local()
    return local


def _region_of(param: Any) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(full shape, offset, local shape) of a parameter on this rank."""
    local = local_view(param)
    if local is param:
        shape = tuple(param.shape)
        return shape, (0,) * len(shape), shape
    shape = tuple(param.shape)
    local_shape, offset = compute_local_shape_and_global_offset(
        param.shape, param.device_mesh, param.placements
    )
    if tuple(local_shape) != tuple(local.shape):
        raise SyncLayoutError(
            f"module_regions: a DTensor's local shape {tuple(local.shape)} is not the "
            f"{tuple(local_shape)} its placements {param.placements} give"
        )
    return shape, tuple(int(o) for o in offset), tuple(int(s) for s in local_shape)


def module_regions(
    module: nn.Module, names: Iterable[str] | None = None
) -> dict[str, tuple[tuple[int, ...], str, tuple[int, ...], tuple[int, ...]]]:
    """This rank's report for :meth:`ModelLayout.from_ranks`: for every parameter (or those in
    ``names``), ``(full shape, dtype name, offset, local shape)``. Works for plain tensors,
    FSDP2 shards and tensor-parallel DTensors alike."""
    wanted = None if names is None else set(names)
    out = {}
    for name, param in module.named_parameters():
        if wanted is not None and name not in wanted:
            continue
        shape, offset, local = _region_of(param)
        out[name] = (shape, _dtype_name(param.dtype), offset, local)
    return out
