"""A detached run's driver side of the trainer (``TrainerConfig.run``).

As each step begins the trainer opens a new call scope and writes the run state
(``_run_state.py``) through the launcher's :class:`~sc_integration.RunSession`; a driver
that re-attached takes over the step its predecessor was in from that state, and a driver
that stops without finishing detaches from the workers, leaving them to the next one.
"""

from __future__ import annotations

import logging

from ._errors import TrainerStateError
from ._output import PendingSave, read_metrics
from ._run_state import AsyncState, RunState
from ._trainer_core import TrainerCore

__all__ = ["TrainerDetached"]

logger = logging.getLogger(__name__)


class TrainerDetached(TrainerCore):
    """Run state, take-over and detaching (a part of ``RayPPOTrainer``)."""

    def _begin_step(self, step: int, recovering: bool = False) -> None:
        """A detached run: a new call scope for ``step`` (the replayed one after a
        re-attach), and the run state written before the step's first call."""
        session = self._session
        if session is None:
            return
        scope = session.begin_step()
        session.write(self._run_state(step, scope, recovering))
        if not recovering:
            self._driver_faults.at(step, "start")

    def _run_state(self, step: int, scope: int, recovering: bool) -> RunState:
        """What a new driver needs to take over ``step`` (see ``_run_state.py``)."""
        session = self._session
        if session is None:
            raise TrainerStateError("RayPPOTrainer: a run state belongs to a detached run")
        pending, sync, pipeline = self._pending_save, self._weight_sync, self._async
        async_state = None
        if pipeline is not None:
            launched = pipeline.launched_step()
            if launched is None:  # a re-attached driver: the generation its predecessor
                launched = session.launch_pending(step)  # launched, not taken yet
            async_state = AsyncState(
                dict(pipeline.actor_version_of),
                pipeline.rollout_actor_version,
                launched,
                None if launched is None else session.launched.get(launched),
            )
        return RunState(
            run_id=session.run_id,
            step=step,
            scope=scope,
            global_step=self.global_step,
            recoveries=self.recoveries,
            pending_save_step=None if pending is None else pending.step,
            pending_save_state=None if pending is None else pending.state,
            weight_sync_version=None if sync is None else sync.version,
            async_state=async_state,
            recovering=recovering,
        )

    def _take_over(self, state: RunState) -> None:
        """Continue where the previous driver of this detached run was when ``state`` was
        written: its step and call scope, metrics, pending checkpoint and versions."""
        session = self._session
        if session is None:
            raise TrainerStateError("RayPPOTrainer: only a detached run is taken over")
        self.global_step = state.global_step
        self.recoveries = state.recoveries
        records = read_metrics(self.output.metrics_path)
        self.history = [r for r in records if r["step"] <= state.global_step]
        self.output.start(self.history)
        if state.pending_save_step is not None and state.pending_save_state is not None:
            saved = [r for r in self.history if r["step"] <= state.pending_save_step]
            self._pending_save = PendingSave(
                state.pending_save_step, state.pending_save_state, saved
            )
        if self._weight_sync is not None and state.weight_sync_version is not None:
            self._weight_sync.version = state.weight_sync_version
        if self._async is not None and state.async_state is not None:
            pipeline = state.async_state
            self._async.restore(pipeline.actor_version_of, pipeline.rollout_actor_version)
        session.replay_from(state)
        logger.warning(
            "run %s: re-attached at step %d (call scope %d, %d steps done)",
            session.run_id,
            state.step,
            state.scope,
            state.global_step,
        )

    def _any_dead(self) -> bool:
        return any(group.dead_ranks for group in self._workers("fit").owned)

    def detach(self) -> None:
        """Forget the worker groups without stopping them: a detached run's driver that
        stops leaves its workers to the next driver (the driver-side threads end)."""
        for part in (self._async, self._agents, self._servers):
            if part is not None:
                part.close()
        self._async = self._agents = self._servers = None
        self._weight_sync = None
        self._groups = None
