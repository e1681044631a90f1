"""``WeightSync``: the controller's side of moving the trainer's weights into a rollout group.

::

    sync = WeightSync(actor_wg, rollout_wg)   # groups of ActorRolloutRefWorker, RolloutWorker
    version = sync.sync()                     # after each update: one line per stage

The first sync gathers both groups' layouts, builds (and caches) the transfer plan and opens a
channel that spans both groups: a torch.distributed group of its own, hosted by the trainer's
rank 0 (gloo on CPU, nccl on CUDA), or in-memory mailboxes when both groups are in-process
(sc-core's ``LocalWorkerGroup``). Each sync then runs in two phases: every trainer rank sends
and every rollout rank receives into a staged copy (the calls run side by side), and only when
all of them succeeded does every rollout rank switch to the new version. If anything fails,
the rollout ranks that still answer drop the staged copy and keep serving the previous
version, :attr:`WeightSync.version` does not advance, and a :class:`WeightSyncError` names the
rank and the version; the next sync sends everything again.
"""

from __future__ import annotations

import concurrent.futures
import logging
import uuid
from typing import Any

from sc_core import (
    CallTimeoutError,
    LocalWorkerGroup,
    WorkerDiedError,
    WorkerError,
    driver_span,
)

from .._errors import WeightSyncError
from ._channel import ChannelSpec
from ._layout import ModelLayout
from ._plan import TransferPlan, plan_for

__all__ = ["WeightSync"]

logger = logging.getLogger(__name__)

#: The registered methods a group's workers must have (``WeightSyncEndpoint``'s).
_ENDPOINTS = (
    "sync_report",
    "sync_served_version",
    "sync_open",
    "sync_send",
    "sync_receive",
    "sync_commit",
)
#: The two groups of a sync, in the order :meth:`WeightSync._both` runs their calls.
_SIDES = ("trainer", "rollout")
#: Once one side of a sync failed, how long the other may take to report its own failure.
_REPORT_GRACE_S = 2.0


class _SideFailure(Exception):
    """One side's failure inside :meth:`WeightSync._both` (never leaves this module)."""

    def __init__(self, side: str, error: BaseException) -> None:
        super().__init__(side, error)
        self.side = side
        self.error = error


def _failed_rank(error: BaseException) -> int | None:
    """The rank a group call's error names: the dead one, the late one, or the one that
    raised (the lowest, where several did)."""
    if isinstance(error, WorkerDiedError) and error.ranks:
        return error.ranks[0]
    if isinstance(error, CallTimeoutError) and error.pending_ranks:
        return error.pending_ranks[0]
    if isinstance(error, WorkerError):
        return error.rank
    rank = getattr(error, "rank", None)
    return rank if isinstance(rank, int) and not isinstance(rank, bool) else None


def _is_in_process(group: Any) -> bool:
    return isinstance(group, LocalWorkerGroup)


class WeightSync:
    """Keeps a rollout group's weights in step with a trainer group's (see the module doc).

    ``timeout_s`` bounds each phase (a rank that does not answer in time fails the sync).
    ``delta=True`` sends, after the first sync over a channel, only the words that changed
    since the last synced version (positions and values where that is smaller than the dense
    message), bit-exact with a dense sync; both sides keep the last version's messages.
    Version numbers only grow, and start after the newest version any rollout rank serves,
    so a WeightSync made later over the same groups (a driver re-attached) goes on from
    the earlier one's numbers.
    """

    def __init__(
        self, trainer: Any, rollout: Any, *, timeout_s: float = 300.0, delta: bool = False
    ) -> None:
        for name, group in (("trainer", trainer), ("rollout", rollout)):
            missing = [m for m in _ENDPOINTS if not callable(getattr(group, m, None))]
            if missing:
                raise WeightSyncError(
                    f"WeightSync: the {name} group {group!r} binds no {missing}; its workers "
                    "must be ActorRolloutRefWorker / RolloutWorker (or mix in WeightSyncEndpoint)"
                )
        if not timeout_s > 0:
            raise WeightSyncError(f"WeightSync: timeout_s must be > 0, got {timeout_s!r}")
        self.trainer = trainer
        self.rollout = rollout
        self.timeout_s = timeout_s
        self.delta = bool(delta)
        #: bytes the last sync put on the wire (all pairs), and what a dense sync would
        self.last_wire_bytes = 0
        self.last_dense_bytes = 0
        # the version both sides hold delta baselines of (over the current channel)
        self._base: int | None = None
        #: the version every rollout rank serves (0: their initial weights)
        self.version = 0
        # the last version number tried: a failed sync uses its number up, so numbers only grow
        self._tried = 0
        self.plan: TransferPlan | None = None
        self._spec: ChannelSpec | None = None
        self._pool = concurrent.futures.ThreadPoolExecutor(2, thread_name_prefix="sc-weight-sync")

    # ------------------------------------------------------------------ set-up
    def _prepare(self) -> TransferPlan:
        if self.plan is not None and self._spec is not None:
            return self.plan
        source = ModelLayout.from_ranks(self.trainer.sync_report())
        destination = ModelLayout.from_ranks(self.rollout.sync_report())
        plan = plan_for(source, destination)
        world = source.world_size + destination.world_size
        name = f"sc-weight-sync-{uuid.uuid4().hex[:12]}"
        if _is_in_process(self.trainer) and _is_in_process(self.rollout):
            spec = ChannelSpec("memory", name, world, timeout_s=self.timeout_s)
        else:
            host, port, device = self.trainer.sync_endpoint()[0]
            spec = ChannelSpec(
                "nccl" if device == "cuda" else "gloo",
                name,
                world,
                host=host,
                port=port,
                timeout_s=self.timeout_s,
            )
        self._both(
            "open the sync channel",
            lambda: self.trainer.sync_open(spec, 0),
            lambda: self.rollout.sync_open(spec, source.world_size),
        )
        logger.info(
            "weight sync: %d trainer ranks -> %d rollout ranks over %s, %d pieces, %d bytes",
            source.world_size,
            destination.world_size,
            spec.kind,
            plan.piece_count,
            plan.total_bytes,
        )
        self.plan, self._spec = plan, spec
        return plan

    def _both(self, what: str, first: Any, second: Any) -> tuple[Any, Any]:
        """Run two blocking group calls side by side (the trainer's, then the rollout's);
        on a failure raise :class:`_SideFailure` naming the group that failed, after both
        have ended, the time limit passed, or -- once one side failed -- the other side had
        :data:`_REPORT_GRACE_S` to report. A dead rank makes its peers' collectives fail
        too, and the death is what names the rank."""
        futures = [self._pool.submit(first), self._pool.submit(second)]
        done, pending = concurrent.futures.wait(
            futures, timeout=self.timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION
        )
        if pending and any(f.exception() is not None for f in done):
            more, pending = concurrent.futures.wait(pending, timeout=_REPORT_GRACE_S)
            done |= more
        failed = [
            (side, error)
            for side, future in zip(_SIDES, futures, strict=True)
            if future in done and (error := future.exception()) is not None
        ]
        if failed:
            # a death first (the root cause), then the trainer's side before the rollout's
            side, error = min(failed, key=lambda f: not isinstance(f[1], WorkerDiedError))
            raise _SideFailure(side, error)
        if pending:
            raise WeightSyncError(
                f"WeightSync: could not {what} within {self.timeout_s} s", version=self._tried
            )
        return futures[0].result(), futures[1].result()

    # -------------------------------------------------------------------- sync
    def sync(self) -> int:
        """Send the trainer's current weights to every rollout rank; returns the new version.

        Raises :class:`WeightSyncError` (naming the rank and the version) when a rank fails;
        the rollout then keeps the previous version and :attr:`version` stays where it was.
        The whole sync is one span, ``<rollout group>.sync_weights``, in the call trace.
        """
        group = getattr(self.rollout, "name_prefix", None) or "rollout"
        with driver_span(str(group), "sync_weights"):
            return self._sync()

    def _sync(self) -> int:
        # set up afresh, number after what any rollout rank serves: an earlier WeightSync
        # over these groups may have moved it past this one's count
        served = 0 if self.plan is not None else self._served_version()
        self._tried = version = max(self._tried, self.version, served) + 1
        try:
            plan = self._prepare()
            base = self._base if self.delta else None
            _, received = self._both(
                f"move version {version}",
                lambda: self.trainer.sync_send(plan, version, base, self.delta),
                lambda: self.rollout.sync_receive(plan, version, base, self.delta),
            )
        except BaseException as exc:
            self._abort(version)
            self.reset()  # set up afresh next time (a rank may have been replaced)
            if isinstance(exc, WeightSyncError):
                raise
            group, cause = (exc.side, exc.error) if isinstance(exc, _SideFailure) else (None, exc)
            rank = _failed_rank(cause)
            where = " ".join(
                str(x) for x in (group, "rank" if rank is not None else None, rank) if x is not None
            )
            raise WeightSyncError(
                f"WeightSync: version {version} failed"
                + (f" on {where}" if where else "")
                + f" ({type(cause).__name__}: {cause}); the rollout keeps version {self.version}",
                rank=rank,
                version=version,
                group=group,
            ) from cause
        expected = [plan.received_by(r) for r in range(plan.destination.world_size)]
        staged = [int(r[0]) for r in received]
        if staged != expected:
            self._abort(version)
            self._base = None
            raise WeightSyncError(
                f"WeightSync: version {version}: the rollout ranks staged {staged} bytes, the "
                f"plan sends {expected}",
                version=version,
            )
        try:
            self.rollout.sync_commit(version)
        except BaseException as exc:
            self.reset()
            raise WeightSyncError(
                f"WeightSync: version {version} could not be switched to on every rollout rank "
                f"({type(exc).__name__}: {exc}); ranks that answered serve it, the others are "
                "gone",
                version=version,
            ) from exc
        self.version = version
        self._base = version
        self.last_wire_bytes = sum(int(r[1]) for r in received)
        self.last_dense_bytes = plan.total_bytes
        return version

    def _served_version(self) -> int:
        """The newest version any rollout rank serves."""
        try:
            return max(self.rollout.sync_served_version(), default=0)
        except Exception as exc:
            rank = _failed_rank(exc)
            raise WeightSyncError(
                "WeightSync: could not read the versions the rollout ranks serve"
                + (f" (rank {rank})" if rank is not None else "")
                + f" ({type(exc).__name__}: {exc}); the rollout keeps version {self.version}",
                rank=rank,
                group="rollout",
            ) from exc

    def reset(self) -> None:
        """Forget the channel and the plan (a group was re-formed after ``replace_ranks``):
        the next :meth:`sync` asks both groups for their layouts again, opens a fresh channel
        and sends everything. The version numbers go on from where they are."""
        self.plan = None
        self._spec = None
        self._base = None

    def _abort(self, version: int) -> None:
        try:
            self.rollout.sync_abort(version)
        except Exception as exc:  # dead ranks cannot answer; the others dropped the staging
            logger.warning("weight sync: abort of version %d: %s", version, exc)

    def close(self) -> None:
        """Leave the channel on both groups (idempotent)."""
        if self._spec is not None:
            for group in (self.trainer, self.rollout):
                try:
                    group.sync_close()
                except Exception as exc:
                    logger.warning("weight sync: closing the channel: %s", exc)
        self.reset()
        self._pool.shutdown(wait=False)

    def __enter__(self) -> WeightSync:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
