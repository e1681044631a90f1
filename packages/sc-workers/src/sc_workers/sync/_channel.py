"""Channels that move the packed pieces of a weight sync between the ranks of two groups.

The trainer's ranks are channel ranks ``0 .. S-1`` and the rollout's ``S .. S+D-1``. A channel
is opened by every participant with the same :class:`ChannelSpec` (the controller makes it):

* :class:`ProcessGroupChannel` — a torch.distributed process group of its own (gloo on CPU,
  nccl on CUDA) over a TCP store hosted by channel rank 0. It is independent of the default
  process group each worker group trains with, so two separately launched groups can share it;
* :class:`InMemoryChannel` — mailboxes in this process, for groups whose workers all live in
  the driver (the local backend): the same sync, every step visible to a debugger.

:meth:`Channel.isend` and :meth:`Channel.irecv` post one message and return a
:class:`Pending` to wait on; messages between two ranks are matched by their ``tag`` (in the
order they were posted, for equal tags). :meth:`Channel.exchange` posts every send and receive
of one rank and waits for all of them.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Protocol

import torch
import torch.distributed as dist

from .._errors import ConfigError, WeightSyncError

__all__ = [
    "Channel",
    "ChannelSpec",
    "InMemoryChannel",
    "Pending",
    "ProcessGroupChannel",
    "open_channel",
]

ChannelKind = Literal["gloo", "nccl", "memory"]


@dataclass(frozen=True)
class ChannelSpec:
    """How to reach a channel: its ``kind``, its unique ``name``, the number of participants,
    the TCP store's address (``kind`` gloo / nccl) and the time limit of each exchange."""

    kind: ChannelKind
    name: str
    world_size: int
    host: str = "127.0.0.1"
    port: int = 0
    timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.kind not in ("gloo", "nccl", "memory"):
            raise ConfigError(f"ChannelSpec.kind must be gloo, nccl or memory, got {self.kind!r}")
        if self.world_size < 2:
            raise ConfigError(f"ChannelSpec.world_size must be >= 2, got {self.world_size}")
        if self.kind != "memory" and not 0 < self.port < 65536:
            raise ConfigError(f"ChannelSpec.port must be a TCP port, got {self.port}")
        if not self.timeout_s > 0:
            raise ConfigError(f"ChannelSpec.timeout_s must be > 0, got {self.timeout_s}")


class Pending(Protocol):
    def wait(self) -> None:
        """Block until the message has been sent / received (bounded by the spec's timeout)."""
        ...


class _Done:
    def wait(self) -> None:
        return None


class Channel(Protocol):
    rank: int
    spec: ChannelSpec

    def isend(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        """Start sending ``tensor`` (contiguous) to channel rank ``peer``."""
        ...

    def irecv(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        """Start receiving a message from ``peer`` into ``tensor`` (contiguous, same size)."""
        ...

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, torch.Tensor]
    ) -> None:
        """Send ``sends[peer]`` to each peer and fill ``receives[peer]`` from each peer."""
        ...

    def close(self) -> None: ...


class ProcessGroupChannel:
    """A torch.distributed process group of its own over the participants of a sync."""

    def __init__(self, spec: ChannelSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        timeout = timedelta(seconds=spec.timeout_s)
        # torch's stubs do not export the store and process-group classes; they are public
        c10d: Any = dist
        store = c10d.TCPStore(
            spec.host, spec.port, spec.world_size, is_master=rank == 0, timeout=timeout
        )
        self._store = c10d.PrefixStore(spec.name, store)
        self._pg: Any
        if spec.kind == "nccl":
            self._pg = c10d.ProcessGroupNCCL(self._store, rank, spec.world_size)
        else:
            self._pg = c10d.ProcessGroupGloo(self._store, rank, spec.world_size, timeout)

    def isend(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        if not tensor.numel():
            return _Done()
        work: Pending = self._pg.send([tensor], peer, tag)
        return work

    def irecv(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        if not tensor.numel():
            return _Done()
        work: Pending = self._pg.recv([tensor], peer, tag)
        return work

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, torch.Tensor]
    ) -> None:
        _exchange(self, sends, receives)

    def close(self) -> None:
        shutdown = getattr(self._pg, "shutdown", None)
        if callable(shutdown):
            shutdown()


class _Mailboxes:
    def __init__(self) -> None:
        self.cond = threading.Condition()
        # messages (from, to, tag), in the order they were sent
        self.boxes: dict[tuple[int, int, int], collections.deque[torch.Tensor]] = {}
        self.open = 0


_mail_lock = threading.Lock()
_mail: dict[str, _Mailboxes] = {}


class InMemoryChannel:
    """Mailboxes in this process: a send is a copy queued for the peer, a receive waits for
    the oldest one (messages between two ranks arrive in the order they were sent)."""

    def __init__(self, spec: ChannelSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank
        with _mail_lock:
            self._boxes = _mail.setdefault(spec.name, _Mailboxes())
            self._boxes.open += 1
        self._closed = False

    def isend(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        boxes = self._boxes
        with boxes.cond:
            key = (self.rank, peer, tag)
            boxes.boxes.setdefault(key, collections.deque()).append(tensor.clone())
            boxes.cond.notify_all()
        return _Done()

    def irecv(self, peer: int, tensor: torch.Tensor, tag: int = 0) -> Pending:
        return _MailboxReceive(self, peer, tensor, tag)

    def exchange(
        self, sends: Mapping[int, torch.Tensor], receives: Mapping[int, torch.Tensor]
    ) -> None:
        _exchange(self, sends, receives)

    def close(self) -> None:
        """Leave the channel; the last participant to leave drops its mailboxes."""
        if self._closed:
            return
        self._closed = True
        with _mail_lock:
            self._boxes.open -= 1
            if self._boxes.open == 0:
                _mail.pop(self.spec.name, None)


class _MailboxReceive:
    """A receive from an in-memory mailbox: :meth:`wait` takes the oldest message with its
    tag (waiting for it up to the spec's timeout) and copies it into place."""

    def __init__(self, channel: InMemoryChannel, peer: int, out: torch.Tensor, tag: int) -> None:
        self._channel, self._peer, self._out, self._tag = channel, peer, out, tag

    def wait(self) -> None:
        channel, peer, out = self._channel, self._peer, self._out
        boxes, key = channel._boxes, (peer, channel.rank, self._tag)
        deadline = time.monotonic() + channel.spec.timeout_s
        with boxes.cond:
            while not boxes.boxes.get(key):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise WeightSyncError(
                        f"weight sync: channel rank {channel.rank} waited "
                        f"{channel.spec.timeout_s} s for channel rank {peer}, which sent nothing",
                        rank=channel.rank,
                    )
                boxes.cond.wait(left)
            data = boxes.boxes[key].popleft()
        if data.numel() != out.numel():
            raise WeightSyncError(
                f"weight sync: channel rank {channel.rank} expected {out.numel()} bytes from "
                f"channel rank {peer}, got {data.numel()}",
                rank=channel.rank,
            )
        out.copy_(data)


def _exchange(
    channel: Channel, sends: Mapping[int, torch.Tensor], receives: Mapping[int, torch.Tensor]
) -> None:
    pending = [channel.isend(peer, t) for peer, t in sorted(sends.items())]
    pending += [channel.irecv(peer, t) for peer, t in sorted(receives.items())]
    for p in pending:
        p.wait()


def open_channel(spec: ChannelSpec, rank: int) -> Channel:
    """This participant's end of the channel ``spec`` (``rank`` in ``0 .. world_size-1``)."""
    if not 0 <= rank < spec.world_size:
        raise ConfigError(
            f"open_channel: rank {rank} is outside the channel's {spec.world_size} participants"
        )
    if spec.kind == "memory":
        return InMemoryChannel(spec, rank)
    return ProcessGroupChannel(spec, rank)
