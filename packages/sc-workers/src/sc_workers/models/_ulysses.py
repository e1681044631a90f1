"""Ulysses sequence parallelism: every sequence split over the ranks of an sp group.

Each rank of an sp group embeds and runs one contiguous shard of every sequence (the
batch right-padded to a multiple of the group size, the padding masked out). Everything
but attention works position by position, so it runs on the shard alone. Around
attention an all-to-all turns this rank's queries, keys and values ``[b, heads, s/sp, d]``
into ``[b, heads/sp, s, d]`` (every position, a slice of the heads), attention runs over
the full sequence with the full mask, and the inverse all-to-all brings the output back to
this rank's positions and all heads. The shards' outputs are all-gathered along the
sequence; since every rank of the group then computes the same loss from the same full
output, the all-gather's backward hands each shard its own slice of the gradient (no
sum), so every position's gradient reaches the parameters exactly once.

:class:`SequenceParallel` is passed down a model's forward (``sequence_parallel=``); the
models call :meth:`SequenceParallel.seq_to_heads` / :meth:`SequenceParallel.heads_to_seq`
around attention, and :func:`sharded_forward` does the padding, sharding and gathering.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from .._errors import BatchError, ConfigError

__all__ = [
    "SP_KWARG",
    "ULYSSES_ATTENTION",
    "SequenceParallel",
    "causal_padding_mask",
    "pad_to_multiple",
    "sharded_forward",
]

#: the name of the keyword argument that carries a :class:`SequenceParallel` from a
#: transformers model's forward down to its attention function
SP_KWARG = "sc_sequence_parallel"
#: the transformers attention implementation that wraps SDPA in the Ulysses all-to-alls
ULYSSES_ATTENTION = "sc_ulysses_sdpa"


class SequenceParallel:
    """This rank's place in its sp group: the group, its rank in it and its size.

    A plain object (not a dataclass), so that FSDP's input casting passes it through.
    """

    __slots__ = ("group", "rank", "size")

    def __init__(self, group: dist.ProcessGroup, rank: int, size: int) -> None:
        if size < 1 or not 0 <= rank < size:
            raise ConfigError(f"SequenceParallel: rank {rank} is outside an sp group of {size}")
        self.group = group
        self.rank = rank
        self.size = size

    @classmethod
    def of_group(cls, group: dist.ProcessGroup) -> SequenceParallel:
        return cls(group, dist.get_rank(group), dist.get_world_size(group))

    def __repr__(self) -> str:
        return f"SequenceParallel(rank={self.rank}, size={self.size})"

    def shard(self, x: Tensor, dim: int = 1) -> Tensor:
        """This rank's contiguous slice of ``x`` along ``dim`` (its length divides by size)."""
        length = x.shape[dim]
        if length % self.size:
            raise BatchError(
                f"SequenceParallel.shard (sp rank {self.rank}): length {length} along dim "
                f"{dim} is not divisible by the sp size {self.size}; pad it first"
            )
        chunk = length // self.size
        return x.narrow(dim, self.rank * chunk, chunk)

    def seq_to_heads(self, x: Tensor, head_dim: int = 1, seq_dim: int = 2) -> Tensor:
        """``[.., heads, s/sp, ..]`` of this rank's positions -> ``[.., heads/sp, s, ..]``."""
        out: Tensor = _AllToAll.apply(x, self, head_dim, seq_dim)
        return out

    def heads_to_seq(self, x: Tensor, head_dim: int = 1, seq_dim: int = 2) -> Tensor:
        """The inverse of :meth:`seq_to_heads`: back to this rank's positions, all heads."""
        out: Tensor = _AllToAll.apply(x, self, seq_dim, head_dim)
        return out

    def gather(self, x: Tensor, dim: int = 1) -> Tensor:
        """The shards of every rank concatenated along ``dim``; the backward returns this
        rank's slice of the gradient (every rank holds the same full-output loss)."""
        out: Tensor = _GatherShards.apply(x, self, dim)
        return out


def _all_to_all(x: Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int) -> Tensor:
    """Split ``x`` into ``sp.size`` chunks along ``scatter_dim``, send chunk j to sp rank j,
    and concatenate the chunks received (in rank order) along ``gather_dim``."""
    if x.shape[scatter_dim] % sp.size:
        raise BatchError(
            f"Ulysses all-to-all (sp rank {sp.rank}): size {x.shape[scatter_dim]} of dim "
            f"{scatter_dim} (the attention heads, or the sequence) is not divisible by the sp "
            f"size {sp.size}"
        )
    send = torch.stack(x.chunk(sp.size, dim=scatter_dim))  # [sp, ...], contiguous
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=sp.group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, x: Tensor, sp: SequenceParallel, scatter_dim: int, gather_dim: int
    ) -> Tensor:
        ctx.sp, ctx.scatter_dim, ctx.gather_dim = sp, scatter_dim, gather_dim
        return _all_to_all(x, sp, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None, None]:
        return _all_to_all(grad, ctx.sp, ctx.gather_dim, ctx.scatter_dim), None, None, None


class _GatherShards(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, sp: SequenceParallel, dim: int) -> Tensor:
        ctx.sp, ctx.dim, ctx.length = sp, dim, x.shape[dim]
        parts = [torch.empty_like(x) for _ in range(sp.size)]
        dist.all_gather(parts, x.contiguous(), group=sp.group)
        return torch.cat(parts, dim=dim)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        sp: SequenceParallel = ctx.sp
        return grad.narrow(ctx.dim, sp.rank * ctx.length, ctx.length).contiguous(), None, None


def pad_to_multiple(
    input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor, multiple: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Right-pad ``[b, s]`` inputs to a length divisible by ``multiple``: token 0, mask 0,
    position 0. The padding comes after every real token and is masked as a key, so no real
    position attends to it; its own outputs are dropped."""
    extra = (-input_ids.shape[1]) % multiple
    if extra == 0:
        return input_ids, attention_mask, position_ids
    padded = tuple(F.pad(t, (0, extra), value=0) for t in (input_ids, attention_mask, position_ids))
    return padded[0], padded[1], padded[2]


def causal_padding_mask(attention_mask: Tensor) -> Tensor:
    """The boolean ``[b, 1, s, s]`` mask of causal attention over non-padding keys (what
    transformers' SDPA mask holds for a ``[b, s]`` padding mask without a cache)."""
    length = attention_mask.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool, device=attention_mask.device).tril()
    return causal[None, None] & attention_mask.bool()[:, None, None, :]


def sharded_forward(
    module: nn.Module,
    sp: SequenceParallel,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor,
) -> Tensor:
    """``module``'s full-sequence output (logits ``[b, s, vocab]`` or values ``[b, s]``),
    computed with each sp rank running its shard of the sequence.

    ``module`` takes ``(input_ids, attention_mask, position_ids, cache, sequence_parallel=)``
    with this rank's shard of the ids and positions and the full (padded) mask, and returns
    its shard's outputs along dim 1.
    """
    length = input_ids.shape[1]
    ids, mask, pos = pad_to_multiple(input_ids, attention_mask, position_ids, sp.size)
    local: Tensor = module(sp.shard(ids), mask, sp.shard(pos), None, sequence_parallel=sp)
    return sp.gather(local, dim=1)[:, :length]
