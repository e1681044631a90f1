"""A whole weight sync in one process: every sender and receiver on a thread of its own over
one in-memory channel (shared by the sync tests that work with hand-made shards)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import torch
from sc_workers.sync import (
    ChannelSpec,
    Region,
    TransferPlan,
    open_channel,
    receive_weights,
    send_weights,
)
from sc_workers.sync._transfer import Received, Sent

Held = dict[str, tuple[torch.Tensor, Region]]


def holdings(plan: TransferPlan, full: dict[str, torch.Tensor], rank: int) -> Held:
    """Source rank ``rank``'s shards of the full tensors (copies)."""
    return {
        name: (full[name][region.within(Region.full(full[name].shape))].clone(), region)
        for name, region in plan.source.ranks[rank].items()
    }


def run_in_memory(
    plan: TransferPlan,
    full: dict[str, torch.Tensor],
    targets: Sequence[Held],
    version: int,
    spare: Sequence[dict[str, torch.Tensor] | None] | None = None,
) -> tuple[list[Sent], list[Received]]:
    """Send ``full``'s shards to ``targets`` (one mapping per destination rank); nothing is
    committed. Re-raises the first failure of any rank."""
    s, d = plan.source.world_size, plan.destination.world_size
    spec = ChannelSpec("memory", f"mem-{id(plan)}-{version}", s + d, timeout_s=30)
    sent: list[Any] = [None] * s
    received: list[Any] = [None] * d
    errors: list[BaseException] = []

    def sender(rank: int) -> None:
        try:
            channel = open_channel(spec, rank)
            sent[rank] = send_weights(channel, plan, rank, holdings(plan, full, rank))
        except BaseException as exc:
            errors.append(exc)

    def receiver(rank: int) -> None:
        try:
            channel = open_channel(spec, s + rank)
            extra = None if spare is None else spare[rank]
            received[rank] = receive_weights(
                channel, plan, rank, targets[rank], version, spare=extra
            )
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=sender, args=(r,)) for r in range(s)]
    threads += [threading.Thread(target=receiver, args=(r,)) for r in range(d)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return sent, received
