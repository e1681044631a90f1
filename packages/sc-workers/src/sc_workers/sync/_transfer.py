"""One rank's part of a sync: a sender packs and sends, a receiver receives and stages.

Channel ranks: the trainer's rank ``r`` is channel rank ``r``, the rollout's rank ``r`` is
channel rank ``S + r`` (``S`` the trainer's world size, ``plan.source.world_size``).

A dense sync cuts each (sender, receiver) pair's pieces into frames (:mod:`._frames`): large
contiguous pieces go straight from the sender's tensor into the receiver's staging tensor,
the rest is packed, and a sender packs one frame while the previous ones are on the wire.

A delta sync (``baseline`` given on both sides: each pair's dense message of the last synced
version) first exchanges a small header per pair (dense or sparse, and the payload's size),
then the payloads, each encoded by :mod:`._delta` against the baseline, one message per pair.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from ._channel import Channel, Pending
from ._delta import decode, encode
from ._frames import Frame, align, contiguous_bytes, frames_of
from ._layout import Region
from ._plan import Piece, TransferPlan
from ._staging import StagedWeights, pack_pieces

__all__ = ["Received", "Sent", "receive_weights", "send_weights"]


@dataclass
class Sent:
    """What a sender moved: bytes on the wire, and per receiver either its dense message (a
    delta sync: the baseline of the next one) or the buffer its packed frames used (a dense
    sync: reused by the next one)."""

    wire_bytes: int
    messages: dict[int, torch.Tensor]


@dataclass
class Received:
    """A receiver's staged weights, bytes on the wire, and per sender its dense message (a
    delta sync) or the buffer its packed frames arrived in (a dense sync)."""

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
    """Send every piece ``src_rank`` owes (in frames; against ``baseline``, only what changed,
    one message per receiver). ``buffers`` (:attr:`Sent.messages` of an earlier sync of the same
    kind) are reused to pack into."""
    offset = plan.source.world_size
    pairs = {d: plan.pair(src_rank, d) for d in plan.receivers_of(src_rank)}
    reuse = buffers or {}
    if baseline is None:
        return _send_frames(channel, offset, pairs, held, reuse)
    messages = {d: pack_pieces(pieces, held, reuse.get(d)) for d, pieces in pairs.items()}
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
    spare: Mapping[str, torch.Tensor] | None = None,
) -> Received:
    """Receive this rank's pieces into a new :class:`StagedWeights` for ``version``, checked
    complete; the live parameters are untouched until its ``commit``. ``buffers``
    (:attr:`Received.messages` of an earlier sync of the same kind) are reused to receive
    into, ``spare`` (what the last commit returned) to stage into."""
    staged = StagedWeights(version, dst_rank, targets, spare)
    device = next(iter(targets.values()))[0].device if targets else torch.device("cpu")
    pairs = {src: plan.pair(src, dst_rank) for src in plan.senders_to(dst_rank)}
    sizes = {src: sum(p.nbytes for p in pieces) for src, pieces in pairs.items()}
    dtypes = {name: getattr(torch, d) for name, d in plan.source.dtypes.items()}
    if baseline is None:
        messages = _receive_frames(channel, pairs, staged, dtypes, buffers or {}, device)
        staged.check_complete()
        return Received(staged, sum(sizes.values()), messages)
    headers = {src: torch.empty(2, dtype=torch.int64) for src in pairs}
    channel.exchange({}, headers)
    payloads = {
        src: torch.empty(int(h[1]), dtype=torch.uint8, device=device) for src, h in headers.items()
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
    for src, pieces in pairs.items():
        staged.add(pieces, messages[src], dtypes)
    staged.check_complete()
    return Received(staged, wire, messages)


def _buffer(old: torch.Tensor | None, size: int, device: torch.device) -> torch.Tensor:
    if old is not None and old.numel() == size and old.device == device:
        return old
    return torch.empty(size, dtype=torch.uint8, device=device)


def _round_robin(per_peer: Mapping[int, list[Frame]]) -> list[tuple[int, Frame]]:
    """Frames of every peer, interleaved (every receiver gets data from the start)."""
    out = []
    queues = [(peer, frames) for peer, frames in sorted(per_peer.items())]
    for i in range(max((len(f) for _, f in queues), default=0)):
        out += [(peer, frames[i]) for peer, frames in queues if i < len(frames)]
    return out


def _layout_frames(
    frames: Mapping[int, list[Frame]],
    direct: Callable[[Frame], torch.Tensor | None],
    reuse: Mapping[int, torch.Tensor],
    device: torch.device,
) -> tuple[dict[int, torch.Tensor], dict[tuple[int, int], tuple[torch.Tensor, bool]]]:
    """Where each frame of each peer's ``frames`` lives on this side: ``direct(frame)`` (the
    frame's bytes in a tensor of this rank, when it is one piece contiguous there), else a
    slot (16-byte aligned) of the peer's buffer, reused from ``reuse`` when its size still
    fits. Returns the buffers by peer, and by ``(peer, tag)`` each frame's memory and whether
    it is a buffer slot (packed / unpacked by this side)."""
    buffers: dict[int, torch.Tensor] = {}
    where: dict[tuple[int, int], tuple[torch.Tensor, bool]] = {}
    for peer, peer_frames in frames.items():
        views = {f.tag: direct(f) for f in peer_frames}
        offsets, size = {}, 0
        for frame in peer_frames:
            if views[frame.tag] is None:
                offsets[frame.tag] = size
                size = align(size + frame.nbytes)
        buffers[peer] = buffer = _buffer(reuse.get(peer), size, device)
        for frame in peer_frames:
            view = views[frame.tag]
            if view is None:
                at = offsets[frame.tag]
                where[(peer, frame.tag)] = (buffer[at : at + frame.nbytes], True)
            else:
                where[(peer, frame.tag)] = (view, False)
    return buffers, where


def _send_frames(
    channel: Channel,
    offset: int,
    pairs: Mapping[int, list[Piece]],
    held: Mapping[str, tuple[torch.Tensor, Region]],
    reuse: Mapping[int, torch.Tensor],
) -> Sent:
    frames = {d: frames_of(pieces) for d, pieces in pairs.items()}

    def direct(frame: Frame) -> torch.Tensor | None:
        if len(frame.pieces) > 1:
            return None
        piece = frame.pieces[0]
        tensor, region = held[piece.name]
        return contiguous_bytes(tensor, region, piece.region)

    device = next(iter(held.values()))[0].device if held else torch.device("cpu")
    buffers, where = _layout_frames(frames, direct, reuse, device)
    pending: list[Pending] = []
    with torch.no_grad():
        for d, frame in _round_robin(frames):
            data, packed = where[(d, frame.tag)]
            if packed:  # pack this frame while the earlier ones are on the wire
                pack_pieces(frame.pieces, held, data)
            pending.append(channel.isend(offset + d, data, frame.tag))
    for p in pending:
        p.wait()
    return Sent(sum(p.nbytes for pieces in pairs.values() for p in pieces), buffers)


def _receive_frames(
    channel: Channel,
    pairs: Mapping[int, list[Piece]],
    staged: StagedWeights,
    dtypes: Mapping[str, torch.dtype],
    reuse: Mapping[int, torch.Tensor],
    device: torch.device,
) -> dict[int, torch.Tensor]:
    frames = {src: frames_of(pieces) for src, pieces in pairs.items()}
    for peer_frames in frames.values():
        for frame in peer_frames:
            staged.expect(frame.pieces)

    def direct(frame: Frame) -> torch.Tensor | None:
        if len(frame.pieces) > 1:
            return None
        piece = frame.pieces[0]
        tensor, region = staged.staging(piece.name)
        if tensor.dtype != dtypes[piece.name]:  # cast on unpacking
            return None
        return contiguous_bytes(tensor, region, piece.region)

    buffers, where = _layout_frames(frames, direct, reuse, device)
    # post every receive, then wait in order, unpacking while later frames arrive
    posted = [
        (channel.irecv(src, where[(src, frame.tag)][0], frame.tag), src, frame)
        for src, frame in _round_robin(frames)
    ]
    for pending, src, frame in posted:
        pending.wait()
        data, packed = where[(src, frame.tag)]
        if packed:
            staged.unpack(frame.pieces, data, dtypes)
    return buffers
