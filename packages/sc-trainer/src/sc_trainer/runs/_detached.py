"""A detached run's driver side (``TrainerConfig.run``): what survives this driver.

As each step begins, :class:`DetachedRun` opens a new call scope and writes the run state
(``_state.py``) through the launcher's :class:`AttachedDriver`, before the step's first call; a
driver that re-attached reads the state its predecessor wrote and takes over the step it
was in, under the same call scopes, so every call the workers already ran is answered from
their journals and nothing runs twice.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Sequence
from typing import Any

from sc_core import WorkerGroup

from ..rollout import EngineServers, RolloutSnapshot, RolloutSource
from ._checkpointer import Checkpointer
from ._driver import AttachedDriver
from ._output import PendingSave, RunOutput, read_metrics
from ._state import RunState

__all__ = ["DetachedRun"]

logger = logging.getLogger(__name__)


class DetachedRun:
    """The driver side of a detached run: its :class:`AttachedDriver` (call ids, call scopes,
    the run state) and, for a driver that re-attached, the state it takes over
    (:attr:`replay`)."""

    def __init__(self, driver: AttachedDriver) -> None:
        self.driver = driver
        #: a re-attached driver: the state its predecessor wrote as its last step began
        #: (``None``: a new run, or one whose first driver died before its first step)
        self.replay: RunState | None = None

    @property
    def run_id(self) -> str:
        return self.driver.run_id

    @property
    def launch_scope(self) -> Callable[[int], contextlib.AbstractContextManager[Any]]:
        """``launch_scope(step)``: the call scope a prefetched generation for ``step`` is
        launched in (its own, so that a new driver can ask for it again)."""
        return self.driver.launch_scope

    def adopt(
        self, groups: Sequence[WorkerGroup[Any]], owned: Sequence[WorkerGroup[Any]]
    ) -> RunState | None:
        """Every call of ``groups`` carries this run's call ids; a re-attached driver reads
        where its predecessor was (:attr:`replay`) and, before any other call, asks the
        journals of ``owned``'s workers for the calls of the step it replays
        (:meth:`AttachedDriver.adopt_journals`: a torn call is completed by the replay, no rank
        is taken as lost); this driver is recorded with the pids of ``owned``'s workers,
        where each group stands and the torn calls found. Returns :attr:`replay`."""
        driver = self.driver
        driver.use_on(groups)
        if driver.attached:
            self.replay = driver.read_state()
            driver.adopt_journals(owned, self.replay)
        driver.record_driver(owned, self.replay)
        return self.replay

    def record_servers(self, servers: EngineServers) -> None:
        """Add this driver's engine servers to its line of ``run_drivers.jsonl``: each
        server's process id (a re-attach keeps the live ones) and which servers it adopted
        from the previous driver."""
        self.driver.amend_driver(
            servers=servers.server_pids(), adopted_servers=list(servers.fleet.adopted)
        )

    def begin_step(
        self,
        step: int,
        *,
        global_step: int,
        recoveries: int,
        pending: PendingSave | None,
        rollout: RolloutSnapshot,
        recovering: bool = False,
    ) -> None:
        """A new call scope for ``step`` (the replayed one after a re-attach), and the run
        state a new driver needs to take ``step`` over, written before its first call."""
        driver = self.driver
        scope = driver.begin_step()
        launched = rollout.launched_step
        if launched is None:  # a re-attached driver: the generation its predecessor
            launched = driver.launch_pending(step)  # launched, not taken yet
        state = RunState(
            run_id=driver.run_id,
            step=step,
            scope=scope,
            global_step=global_step,
            recoveries=recoveries,
            pending_save_step=None if pending is None else pending.step,
            pending_save_state=None if pending is None else pending.state,
            rollout=dataclasses.replace(rollout, launched_step=launched),
            launched_scope=None if launched is None else driver.launched.get(launched),
            recovering=recovering,
        )
        driver.write(state)

    def take_over(
        self,
        state: RunState,
        output: RunOutput,
        checkpointer: Checkpointer,
        rollout: RolloutSource,
    ) -> list[dict[str, Any]]:
        """Continue in ``state``'s step and call scope: the metrics in ``output`` up to its
        step (returned, and ``metrics.jsonl`` rewritten to them), the checkpoint its
        predecessor left pending, the rollout source's versions. The caller restores its
        step count and recoveries."""
        records = read_metrics(output.metrics_path)
        history = [r for r in records if r["step"] <= state.global_step]
        output.start(history)
        if state.pending_save_step is not None and state.pending_save_state is not None:
            saved = [r for r in history if r["step"] <= state.pending_save_step]
            checkpointer.adopt(state.pending_save_step, state.pending_save_state, saved)
        rollout.restore(state.rollout)
        self.driver.replay_from(state)
        logger.warning(
            "run %s: re-attached at step %d (call scope %d, %d steps done)",
            self.driver.run_id,
            state.step,
            state.scope,
            state.global_step,
        )
        return history

    def forget_launches(self) -> None:
        """A recovery dropped the prefetched generations: their steps generate afresh."""
        self.driver.forget_launches()
