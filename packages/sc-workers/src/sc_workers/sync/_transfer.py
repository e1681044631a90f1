"""One rank's part of a sync: a sender packs and sends, a receiver receives and stages.

Channel ranks: the trainer's rank ``r`` is channel rank ``r``, the rollout's rank ``r`` is
channel rank ``S + r`` (``S`` the trainer's world size, ``plan.source.world_size``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ._channel import Channel
from ._layout import Region
from ._plan import TransferPlan
from ._staging import StagedWeights, pack_pieces, unpack_pieces

__all__ = ["receive_weights", "send_weights"]


def send_weights(
    channel: Channel,
    plan: TransferPlan,
    src_rank: int,
    held: Mapping[str, tuple[torch.Tensor, Region]],
) -> int:
    """Send every piece ``src_rank`` owes (one message per receiver); returns the bytes sent."""
    offset = plan.source.world_size
    sends = {
        offset + dst: pack_pieces(pieces, held)
        for (src, dst), pieces in plan.by_pair.items()
        if src == src_rank
    }
    channel.exchange(sends, {})
    return sum(int(t.numel()) for t in sends.values())


def receive_weights(
    channel: Channel,
    plan: TransferPlan,
    dst_rank: int,
    targets: Mapping[str, tuple[torch.Tensor, Region]],
    version: int,
) -> StagedWeights:
    """Receive this rank's pieces into a new :class:`StagedWeights` for ``version``, checked
    complete; the live parameters are untouched until its ``commit``."""
    staged = StagedWeights(version, dst_rank, targets)
    device = next(iter(targets.values()))[0].device if targets else torch.device("cpu")
    pairs = {src: pieces for (src, dst), pieces in plan.by_pair.items() if dst == dst_rank}
    receives = {
        src: torch.empty(sum(p.nbytes for p in pieces), dtype=torch.uint8, device=device)
        for src, pieces in pairs.items()
    }
    channel.exchange({}, receives)
    dtypes = {name: getattr(torch, d) for name, d in plan.source.dtypes.items()}
    for src, pieces in pairs.items():
        unpack_pieces(staged, pieces, receives[src], dtypes)
    staged.check_complete()
    return staged
