"""One rank's part of a sync: a sender packs and sends, a receiver receives and stages.

Channel ranks: the trainer's rank ``r`` is channel rank ``r``, the rollout's rank ``r`` is
channel rank ``S + r`` (``S`` the trainer's world size, ``plan.source.world_size``).

A dense sync is one message per (sender, receiver) pair. A delta sync (``baseline`` given,
on both sides: each pair's dense message of the last synced version) first exchanges a small
header per pair (dense or sparse, and the payload's size), then the payloads, each encoded by
:mod:`._delta` against the baseline.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ._channel import Channel
from ._delta import decode, encode
from ._layout import Region
from ._plan import Piece, TransferPlan
from ._staging import StagedWeights, pack_pieces

__all__ = ["Received", "Sent", "receive_weights", "send_weights"]


@dataclass
class Sent:
    """What a sender moved: bytes on the wire, and each receiver's dense message (the
    baseline of the next delta sync)."""

    wire_bytes: int
    messages: dict[int, torch.Tensor]


@dataclass
class Received:
    """A receiver's staged weights, bytes on the wire, and each sender's dense message."""

    staged: StagedWeights
    wire_bytes: int
    messages: dict[int, torch.Tensor]


def _word(plan: TransferPlan, pieces: list[Piece]) -> int:
    return min((plan.source.nbytes(p.name, Region.full((1,))) for p in pieces), default=1)


def send_weights(
    channel: Channel,
    plan: TransferPlan,
    src_rank: int,
    held: Mapping[str, tuple[torch.Tensor, Region]],
    baseline: Mapping[int, torch.Tensor] | None = None,
    buffers: Mapping[int, torch.Tensor] | None = None,
) -> Sent:
    """Send every piece ``src_rank`` owes (one message per receiver; against ``baseline``,
    only what changed). ``buffers`` (each receiver's message of an earlier sync) are reused
    to pack into."""
    offset = plan.source.world_size
    pairs = {d: plan.pair(src_rank, d) for d in plan.receivers_of(src_rank)}
    reuse = buffers or {}
    messages = {d: pack_pieces(pieces, held, reuse.get(d)) for d, pieces in pairs.items()}
    if baseline is None:
        channel.exchange({offset + d: m for d, m in messages.items()}, {})
        return Sent(sum(int(m.numel()) for m in messages.values()), messages)
    encoded = {d: encode(m, baseline.get(d), _word(plan, pairs[d])) for d, m in messages.items()}
    headers = {
        offset + d: torch.tensor([mode, payload.numel()], dtype=torch.int64)
        for d, (mode, payload) in encoded.items()
    }
    channel.exchange(headers, {})
    channel.exchange({offset + d: payload for d, (_, payload) in encoded.items()}, {})
    wire = sum(int(p.numel()) + 16 for _, p in encoded.values())
    return Sent(wire, messages)


def receive_weights(
    channel: Channel,
    plan: TransferPlan,
    dst_rank: int,
    targets: Mapping[str, tuple[torch.Tensor, Region]],
    version: int,
    baseline: Mapping[int, torch.Tensor] | None = None,
    buffers: Mapping[int, torch.Tensor] | None = None,
) -> Received:
    """Receive this rank's pieces into a new :class:`StagedWeights` for ``version``, checked
    complete; the live parameters are untouched until its ``commit``. ``buffers`` (each
    sender's message of an earlier, committed sync) are reused to receive into."""
    staged = StagedWeights(version, dst_rank, targets)
    device = next(iter(targets.values()))[0].device if targets else torch.device("cpu")
    pairs = {src: plan.pair(src, dst_rank) for src in plan.senders_to(dst_rank)}
    sizes = {src: sum(p.nbytes for p in pieces) for src, pieces in pairs.items()}
    if baseline is None:
        reuse = buffers or {}
        messages = {src: _buffer(reuse.get(src), n, device) for src, n in sizes.items()}
        channel.exchange({}, messages)
        wire = sum(sizes.values())
    else:
        headers = {src: torch.empty(2, dtype=torch.int64) for src in pairs}
        channel.exchange({}, headers)
        payloads = {
            src: torch.empty(int(h[1]), dtype=torch.uint8, device=device)
            for src, h in headers.items()
        }
        channel.exchange({}, payloads)
        messages = {
            src: decode(
                int(headers[src][0]),
                payloads[src],
                baseline.get(src),
                _word(plan, pairs[src]),
                sizes[src],
            )
            for src in pairs
        }
        wire = sum(int(p.numel()) + 16 for p in payloads.values())
    dtypes = {name: getattr(torch, d) for name, d in plan.source.dtypes.items()}
    for src, pieces in pairs.items():
        staged.add(pieces, messages[src], dtypes)
    staged.check_complete()
    return Received(staged, wire, messages)


def _buffer(old: torch.Tensor | None, size: int, device: torch.device) -> torch.Tensor:
    if old is not None and old.numel() == size and old.device == device:
        return old
    return torch.empty(size, dtype=torch.uint8, device=device)
