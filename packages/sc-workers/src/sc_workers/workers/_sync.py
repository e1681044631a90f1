"""The worker side of a weight sync: registered methods that :class:`~sc_workers.WeightSync`
calls on the trainer's group (senders) and on the rollout's group (receivers).

A worker class mixes :class:`WeightSyncEndpoint` in and says which engine holds the weights
(:meth:`WeightSyncEndpoint._sync_engine`). Its state lives in attributes named ``_sc_sync_*``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
from sc_core import Worker
from sc_dispatch import Dispatch, register

from .._errors import WeightSyncError
from ..engine import Engine
from ..sync import (
    Channel,
    ChannelSpec,
    StagedWeights,
    TransferPlan,
    held_tensors,
    module_regions,
    open_channel,
    receive_weights,
    send_weights,
)

__all__ = ["WeightSyncEndpoint"]

logger = logging.getLogger(__name__)


class WeightSyncEndpoint:
    """Registered ``sync_*`` methods; the committed weight version is ``weight_version``."""

    rank: int
    _sc_sync_channel: Channel | None = None
    _sc_sync_staged: StagedWeights | None = None
    _sc_sync_version: int = 0
    # delta sync: each peer's dense message of a version, by version (sender and receiver)
    _sc_sync_baselines: dict[int, dict[int, torch.Tensor]] | None = None
    # dense sync: the last packed frames sent / received, reused as buffers by the next one
    _sc_sync_buffers: dict[int, torch.Tensor] | None = None
    # receiver: the storage the last commit freed, the staging space of the next sync
    _sc_sync_spare: dict[str, torch.Tensor] | None = None

    def _sync_baseline(self, base: int | None, method: str) -> dict[int, torch.Tensor] | None:
        """The messages of version ``base`` (``None``: a dense sync)."""
        if base is None:
            return None
        baselines = self._sc_sync_baselines or {}
        if base not in baselines:
            raise WeightSyncError(
                f"{self._sync_where(method)}: no baseline of version {base} for a delta sync "
                f"(have {sorted(baselines)})",
                rank=self.rank,
                version=base,
            )
        return baselines[base]

    def _keep_baseline(
        self, version: int, messages: dict[int, torch.Tensor], base: int | None
    ) -> None:
        """Keep ``version``'s messages (and ``base``'s, until ``version`` is committed)."""
        kept = {v: m for v, m in (self._sc_sync_baselines or {}).items() if v == base}
        kept[version] = messages
        self._sc_sync_baselines = kept

    def _sync_engine(self, method: str) -> Engine:
        """The engine whose module's parameters this worker sends or receives."""
        raise NotImplementedError(f"{type(self).__name__} does not take part in weight sync")

    def _sync_where(self, method: str) -> str:
        return f"{type(self).__name__}.{method} (rank {self.rank})"

    @property
    def weight_version(self) -> int:
        """The version of the weights this worker serves (0: its initial weights)."""
        return self._sc_sync_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_served_version(self) -> int:
        """The version of the weights this rank serves (:attr:`weight_version`), which a
        :class:`~sc_workers.WeightSync` made later reads to number its syncs after it."""
        return self.weight_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_report(self) -> dict[str, Any]:
        """This rank's regions of every parameter (see ``sc_workers.sync.module_regions``)."""
        return module_regions(self._sync_engine("sync_report").module)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_endpoint(self) -> tuple[str, int, str]:
        """``(node address, a free port, device type)`` for a channel hosted on this rank."""
        engine = self._sync_engine("sync_endpoint")
        return Worker._get_node_ip(), Worker._get_free_port(), engine.device.type

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_open(self, spec: ChannelSpec, offset: int) -> None:
        """Join the channel ``spec`` as channel rank ``offset + rank`` (closing an older one,
        and dropping the baselines of delta syncs over it)."""
        if self._sc_sync_channel is not None:
            self._sc_sync_channel.close()
        self._sync_drop_buffers()
        self._sc_sync_channel = open_channel(spec, offset + self.rank)

    def _sync_drop_staged(self) -> None:
        """Forget a staged version: it was staged into the tensors of an engine that is gone
        (the process groups were torn down); its commit then fails and the version before
        it is still served."""
        self._sc_sync_staged = None

    def _sync_drop_buffers(self) -> None:
        """Forget the delta baselines and the buffers kept for the next sync."""
        self._sc_sync_baselines = None
        self._sc_sync_buffers = None
        self._sc_sync_spare = None

    def _channel(self, method: str) -> Channel:
        if self._sc_sync_channel is None:
            raise WeightSyncError(
                f"{self._sync_where(method)}: no sync channel; WeightSync opens one first",
                rank=self.rank,
            )
        return self._sc_sync_channel

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_send(
        self, plan: TransferPlan, version: int, base: int | None = None, delta: bool = False
    ) -> int:
        """Send this rank's pieces of ``plan`` (with ``base``, only what changed since that
        version; ``delta`` keeps this version's messages for the next one); returns the bytes
        put on the wire."""
        engine = self._sync_engine("sync_send")
        channel = self._channel("sync_send")
        baseline = self._sync_baseline(base, "sync_send")
        with engine.on_device():
            held = held_tensors(engine.module, plan.source.ranks[self.rank])
            reuse = None if delta else self._sc_sync_buffers
            sent = send_weights(channel, plan, self.rank, held, baseline, reuse)
        if delta:
            self._keep_baseline(version, sent.messages, base)
        else:
            self._sc_sync_buffers = sent.messages
        logger.debug("rank %d: sent %d bytes of version %d", self.rank, sent.wire_bytes, version)
        return sent.wire_bytes

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_receive(
        self, plan: TransferPlan, version: int, base: int | None = None, delta: bool = False
    ) -> tuple[int, int]:
        """Receive and stage this rank's pieces of version ``version`` (the live weights stay
        as they are until :meth:`sync_commit`; ``base`` and ``delta`` as in
        :meth:`sync_send`); returns ``(bytes staged, bytes on the wire)``."""
        where = self._sync_where("sync_receive")
        if version <= self._sc_sync_version:
            raise WeightSyncError(
                f"{where}: version {version} is not newer than the served version "
                f"{self._sc_sync_version}",
                rank=self.rank,
                version=version,
            )
        engine = self._sync_engine("sync_receive")
        channel = self._channel("sync_receive")
        baseline = self._sync_baseline(base, "sync_receive")
        self._sc_sync_staged = None
        targets = held_tensors(engine.module, plan.destination.ranks[self.rank])
        reuse = None if delta else self._sc_sync_buffers
        got = receive_weights(
            channel, plan, self.rank, targets, version, baseline, reuse, self._sc_sync_spare
        )
        self._sc_sync_staged = got.staged
        if delta:
            self._keep_baseline(version, got.messages, base)
        else:
            self._sc_sync_buffers = got.messages
        return got.staged.bytes_received, got.wire_bytes

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_commit(self, version: int) -> int:
        """Switch to the staged version ``version`` (every rank has received its part)."""
        staged = self._sc_sync_staged
        if staged is None or staged.version != version:
            have = None if staged is None else staged.version
            raise WeightSyncError(
                f"{self._sync_where('sync_commit')}: version {version} is not staged (staged: "
                f"{have}); the rank keeps version {self._sc_sync_version}",
                rank=self.rank,
                version=version,
            )
        self._sc_sync_spare = staged.commit()
        self._sc_sync_staged = None
        self._sc_sync_version = version
        return version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_abort(self, version: int) -> int:
        """Drop a staged version (and its delta baseline); returns the version still served."""
        if self._sc_sync_staged is not None and self._sc_sync_staged.version == version:
            self._sc_sync_staged = None
        if self._sc_sync_baselines is not None:
            self._sc_sync_baselines.pop(version, None)
        return self._sc_sync_version

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sync_close(self) -> None:
        """Leave the sync channel."""
        if self._sc_sync_channel is not None:
            self._sc_sync_channel.close()
            self._sc_sync_channel = None

    def _sync_forget(self) -> None:
        """Leave the channel and forget every sync (the group was re-formed: the model is
        built again, from its initial weights, by the next ``init_model``)."""
        try:
            self.sync_close()
        except Exception as exc:  # a channel whose peer died may fail to shut down
            logger.warning("rank %d: closing the sync channel: %s", self.rank, exc)
            self._sc_sync_channel = None
        self._sc_sync_staged = None
        self._sc_sync_version = 0
        self._sync_drop_buffers()
