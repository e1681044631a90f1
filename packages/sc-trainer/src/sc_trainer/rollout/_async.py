"""The asynchronous trainer's rollout pipeline: generation one step ahead, under a staleness
bound.

With ``TrainerConfig.async_staleness`` k > 0 (and a separately placed rollout), the trainer's
rollout source is an :class:`AsyncRollout`: taking step ``s``'s batch launches step
``s + 1``'s generation, a non-blocking call on the rollout group, before the trainer computes
the log-probs, values, advantages and updates of step ``s`` on the actor's (and critic's)
groups. The rollout group samples while the actor trains.

Versions are counted in actor updates: the actor is at version ``v`` after ``v`` updates
(a resumed run at its checkpoint's step), and every weight sync records which actor version
it sent (:meth:`AsyncRollout.synced`). A rollout batch carries the sync version it was
sampled with in ``meta_info["weight_version"]``; its *staleness* when it trains the actor
from version ``v`` to ``v + 1`` is ``v`` minus the actor version of those weights. The bound:

* a generation for step ``s`` (used at actor version ``s - 1``) is not started while the
  rollout's weights are older than actor version ``s - 1 - k``
  (:meth:`AsyncRollout.needs_sync`: the weights are synced after the update first);
* :meth:`AsyncRollout.take_batch` checks every batch it hands out, and both raise
  :class:`~sc_trainer.rollout.StalenessBoundError` if the bound would be broken.

One generation is in flight at a time: the rollout group runs its calls one after another,
so a second queued generation would only delay the next weight sync. A weight sync first
waits for the generation in flight (:meth:`AsyncRollout.drain`), so the sync never runs
while the rollout is mid-generation.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sc_core import WorkerGroup, driver_span
from sc_protocol import DataProto
from sc_workers import RolloutWorker, WeightSync

from .._errors import StalenessBoundError, WorkerOutputError, int_at_least
from ._source import PromptSource, RolloutSnapshot, Stage
from ._workers import padded_to

__all__ = ["AsyncRollout", "GenerationWindow"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GenerationWindow:
    """When one prefetched generation ran, as seen from the driver (``time.time()``)."""

    step: int
    launched: float
    finished: float


@dataclass
class _InFlight:
    step: int
    future: concurrent.futures.Future[tuple[DataProto, float]]
    launched: float = field(default_factory=time.time)


class AsyncRollout:
    """The rollout source of an asynchronous run: the in-flight generation, its target step
    and the staleness check (see the module doc). ``prompts`` makes each step's batch;
    ``weight_sync`` brings ``rollout`` the actor's weights after an update (``None``: the
    caller syncs and reports it with :meth:`synced`); ``dp_size`` is the rollout group's
    data-parallel size (a validation batch is padded to it)."""

    def __init__(
        self,
        rollout: WorkerGroup[RolloutWorker],
        prompts: PromptSource,
        staleness: int,
        last_step: int,
        *,
        weight_sync: WeightSync | None = None,
        dp_size: int = 1,
        call_scope: Callable[[int], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        int_at_least(staleness, 1, "AsyncRollout: staleness", StalenessBoundError)
        self.rollout = rollout
        self.prompts = prompts
        self.weight_sync = weight_sync
        self.dp_size = dp_size
        self.staleness = staleness
        self.last_step = last_step
        #: ``call_scope(step)``: the context a detached run launches step ``step``'s
        #: generation in (its own call scope, so a new driver can ask for it again)
        self.call_scope = call_scope
        #: sync (weight) version -> the actor version whose weights it sent
        self.actor_version_of: dict[int, int] = {}
        #: the actor version the rollout's current weights came from (None: before any sync)
        self.rollout_actor_version: int | None = None
        #: when each prefetched generation ran, for the overlap figures of a benchmark
        self.windows: list[GenerationWindow] = []
        self._in_flight: _InFlight | None = None
        self._ready: dict[int, DataProto] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sc-async-rollout")

    # ---------------------------------------------------------------- versions
    def synced(self, weight_version: int, actor_version: int) -> None:
        """A weight sync made the rollout serve ``weight_version``, the weights of actor
        version ``actor_version``."""
        self.actor_version_of[weight_version] = actor_version
        self.rollout_actor_version = actor_version

    def allowed(self, step: int) -> bool:
        """Whether the rollout's current weights may sample step ``step``'s batch (it trains
        actor version ``step - 1``: the weights must be of version ``step - 1 - k`` or newer)."""
        version = self.rollout_actor_version
        return version is not None and version >= step - 1 - self.staleness

    def needs_sync(self, actor_version: int, validate: bool) -> bool:
        """After the update to ``actor_version``: must the rollout get those weights now?
        Yes when the next generation to launch would otherwise break the bound, and before a
        validation (it measures the actor's current weights)."""
        if validate:
            return self.rollout_actor_version != actor_version
        launched = self._launched_step()
        upcoming = (actor_version if launched is None else launched) + 1
        return upcoming <= self.last_step and not self.allowed(upcoming)

    def launched_step(self) -> int | None:
        """The step whose generation is in flight or waits to be taken (the newest)."""
        return self._launched_step()

    def _launched_step(self) -> int | None:
        if self._in_flight is not None:
            return self._in_flight.step
        return max(self._ready) if self._ready else None

    # ------------------------------------------------------------- generation
    def launch(self, step: int) -> None:
        """Start step ``step``'s generation (non-blocking); nothing past the last step, nothing
        already launched."""
        if step > self.last_step or step in self._ready:
            return
        if self._in_flight is not None:
            if self._in_flight.step == step:
                return
            raise StalenessBoundError(
                f"AsyncRollout.launch: step {step} while step {self._in_flight.step}'s "
                "generation is in flight (one at a time)"
            )
        if not self.allowed(step):
            raise StalenessBoundError(
                f"AsyncRollout.launch: step {step} trains actor version {step - 1}; the "
                f"rollout's weights are of version {self.rollout_actor_version}, more than "
                f"async_staleness={self.staleness} behind; sync the weights first"
            )
        prompts = self.prompts.train_batch(step)
        # the non-blocking call is made here; the pool's thread waits for its result, so
        # the trace shows the generation as one span from launch to completion
        proxy = self.rollout.generate_sequences.options(blocking=False)
        scope = contextlib.nullcontext() if self.call_scope is None else self.call_scope(step)
        with scope:
            pending = proxy(prompts)
        self._in_flight = _InFlight(step, self._pool.submit(self._wait, step, pending))

    def _wait(self, step: int, pending: Any) -> tuple[DataProto, float]:
        """On the pool's thread: the generation's batch, and when it arrived."""
        with driver_span("rollout", "generate_async"):
            out = pending.get()
        finished = time.time()
        if not isinstance(out, DataProto):
            raise WorkerOutputError(
                f"AsyncRollout: step {step}'s generation returned {type(out).__name__}, "
                "not a DataProto"
            )
        return out, finished

    def drain(self) -> None:
        """Wait for the generation in flight and keep its batch (before a weight sync)."""
        flight, self._in_flight = self._in_flight, None
        if flight is None:
            return
        out, finished = flight.future.result()
        self.windows.append(GenerationWindow(flight.step, flight.launched, finished))
        self._ready[flight.step] = out

    def take_batch(self, step: int) -> tuple[DataProto, int]:
        """Step ``step``'s batch (launched now if it was not) and its staleness in versions;
        raises :class:`StalenessBoundError` if it is more than k versions old."""
        if step not in self._ready:
            if self._in_flight is None or self._in_flight.step != step:
                self.launch(step)
            self.drain()
        batch = self._ready.pop(step)
        weight_version = batch.meta_info.get("weight_version")
        if not isinstance(weight_version, int) or weight_version not in self.actor_version_of:
            raise StalenessBoundError(
                f"AsyncRollout.take_batch: step {step}'s batch has weight_version "
                f"{weight_version!r}, which no weight sync of this run sent"
            )
        age = (step - 1) - self.actor_version_of[weight_version]
        if age > self.staleness:
            raise StalenessBoundError(
                f"AsyncRollout.take_batch: step {step}'s batch was sampled with weight_version "
                f"{weight_version} (actor version {self.actor_version_of[weight_version]}), "
                f"{age} versions behind the actor's {step - 1}: more than "
                f"async_staleness={self.staleness}"
            )
        return batch, age

    def drop(self) -> None:
        """Forget every prefetched batch (a recovery, the end of a run): a generation in
        flight is waited for and its result, or error, discarded."""
        flight, self._in_flight = self._in_flight, None
        dropped = sorted(self._ready)
        self._ready.clear()
        if flight is not None:
            dropped.append(flight.step)
            try:
                flight.future.result()
            except Exception as exc:  # the run goes on without it
                logger.warning("async rollout: step %d's dropped generation: %s", flight.step, exc)
        if dropped:
            logger.info("async rollout: dropped the prefetched batches of steps %s", dropped)

    # ------------------------------------------------------------ the source
    @property
    def on_policy(self) -> bool:
        """A batch may be up to ``staleness`` versions behind the actor: the PPO ratio is
        against the policy that sampled it."""
        return False

    def start(self, version: int) -> None:
        """The rollout gets the actor's weights of ``version`` over a fresh channel (its
        group may have been re-formed)."""
        self.drop()
        if self.weight_sync is not None:
            self.weight_sync.reset()
            self.synced(self.weight_sync.sync(), version)

    def take(self, step: int, stage: Stage) -> tuple[DataProto, dict[str, Any]]:
        with stage("generate"):  # the prefetched batch; the next one samples while we train
            batch, staleness = self.take_batch(step)
            if self.allowed(step + 1):
                self.launch(step + 1)
        return batch, {"rollout/staleness": staleness}

    def after_update(self, step: int, stage: Stage, validates: bool) -> dict[str, Any]:
        """Sync the weights when the next generation or a validation needs them (after the
        generation in flight ends)."""
        if self.weight_sync is None or not self.needs_sync(step, validate=validates):
            return {}
        with stage("generate"):  # the generation in flight ends before the sync
            self.drain()
        with stage("sync_weights"):  # the rollout samples the next step with these weights
            version = self.weight_sync.sync()
            self.synced(version, step)
        return {"sync/weight_version": version}

    def validation_batch(self, step: int) -> DataProto:
        """Greedy responses on the rollout group (synced to the actor's weights first:
        :meth:`after_update` with ``validates``)."""
        prompts = self.prompts.val_batch()
        out = self.rollout.generate_sequences(padded_to(prompts, self.dp_size))
        return out[: len(prompts)]

    def snapshot(self) -> RolloutSnapshot:
        sync = self.weight_sync
        return RolloutSnapshot(
            weight_sync_version=None if sync is None else sync.version,
            actor_version_of=dict(self.actor_version_of),
            rollout_actor_version=self.rollout_actor_version,
            launched_step=self.launched_step(),
        )

    def restore(self, snapshot: RolloutSnapshot) -> None:
        """Take over a previous driver's versions (a detached run's re-attach)."""
        if self.weight_sync is not None and snapshot.weight_sync_version is not None:
            self.weight_sync.version = snapshot.weight_sync_version
        self.actor_version_of = dict(snapshot.actor_version_of)
        self.rollout_actor_version = snapshot.rollout_actor_version

    def close(self, *, detach: bool = False) -> None:
        """Wait for the generation in flight, stop the pool's thread, and leave the weight
        sync's channel (a detached run's driver leaves it to the next)."""
        self.drop()
        self._pool.shutdown(wait=True)
        sync, self.weight_sync = self.weight_sync, None
        if sync is not None and not detach:
            sync.close()
