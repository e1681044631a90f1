"""The driver's side of exactly-once in a detached run (``TrainerConfig.run``).

:class:`AttachedDriver` holds one sc-core ``CallIds`` (the run's epoch) shared by every worker
group, one call scope per step begun (and one per prefetched generation), and the run state
written atomically as each step begins (``_state.py``). A re-attached driver replays the
interrupted step under the same scopes: every call the workers already ran is answered from
their journals. Before anything else it asks every group's journals of those scopes
(:meth:`AttachedDriver.adopt_journals`, sc-core's ``WorkerGroup.adopt_journals``): a call the
previous driver handed to some ranks of a group only (a *torn* call) is completed by the
replay, which calls it again with the same id: the ranks that have it answer from their
journals, the others run it. The launcher that makes a driver is
:class:`~sc_trainer.launch.DetachedRayLauncher`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sc_core import CallIds, TornCall, WorkerDiedError, WorkerGroup

from .._errors import TrainerStateError
from ._state import RUN_STATE, RunState, read_run_state, write_run_state

__all__ = ["DRIVERS_LOG", "AttachedDriver"]

logger = logging.getLogger(__name__)

#: The file of the output folder that lists each driver of a detached run.
DRIVERS_LOG = "run_drivers.jsonl"


class AttachedDriver:
    """The driver attached to a detached run: its call ids, call scopes and run state (what
    makes each call run exactly once across the drivers of the run)."""

    def __init__(self, run: Any, folder: Path) -> None:
        self.run = run
        self.run_id: str = run.run_id
        #: whether this driver re-attached to a run another driver started
        self.attached: bool = bool(run.attached)
        self.call_ids = CallIds(epoch=int(run.epoch))
        self.folder = folder
        self._scope = 0
        self._replay: int | None = None
        #: the call scope of each prefetched generation, by the step it generates for
        self.launched: dict[int, int] = {}
        #: the torn calls a re-attached driver found in the journals (:meth:`adopt_journals`)
        self.torn_calls: list[TornCall] = []

    def read_state(self) -> RunState | None:
        """The state the previous driver wrote (a re-attached driver reads it once), or
        ``None`` when that driver died before its first step began (while its workers
        built their models). :class:`RunStateNotFoundError` when the output folder is not
        the run's: no driver of it wrote there."""
        if not (self.folder / RUN_STATE).exists() and (self.folder / DRIVERS_LOG).exists():
            return None
        return read_run_state(self.folder, self.run_id)

    def adopt_journals(
        self, groups: Sequence[WorkerGroup[Any]], state: RunState | None
    ) -> list[TornCall]:
        """A re-attached driver's first question to the workers: every live rank's journal
        of the scopes it replays (``state``'s step and the generation it launched; scope 0,
        the workers' set-up, when the previous driver died before its first step). Returns
        the torn calls (some ranks have them, other ranks they were sent to never got
        them), which the replay completes: every later call of those scopes goes to a rank
        that has it on its control lane (answered from its journal, or from the running
        original), to the others on their main lane (see sc-core's ``adopt_journals``)."""
        if state is None:
            scopes = {0}
        else:
            scopes = {state.scope}
            if state.launched_scope is not None:
                scopes.add(state.launched_scope)
        torn: list[TornCall] = []
        for group in groups:
            try:
                torn.extend(group.adopt_journals(sorted(scopes)))
            except WorkerDiedError:  # lost meanwhile: recovered next, not completed
                continue
        self.torn_calls = torn
        if torn:
            logger.warning(
                "run %s: %d torn call(s) in the replayed step; the replay completes them "
                "(no rank is replaced): %s",
                self.run_id,
                len(torn),
                "; ".join(str(c) for c in torn),
            )
        return torn

    def replay_from(self, state: RunState) -> None:
        """Take over ``state``'s step: its scope is the next one :meth:`begin_step` uses,
        and new scopes follow it as they did for the previous driver."""
        self._replay = state.scope
        self._scope = state.scope - 1
        launched = state.rollout.launched_step
        if launched is not None and state.launched_scope is not None:
            self.launched[launched] = state.launched_scope

    def _new_scope(self) -> int:
        self._scope += 1
        return self._scope

    def begin_step(self) -> int:
        """The call scope of the step that begins now (the replayed step's after a
        re-attach); every worker group's calls carry it from here on."""
        scope = self._new_scope()
        if self._replay is not None:
            scope, self._replay = self._replay, None
        self.call_ids.begin(scope)
        return scope

    def launch_scope(self, step: int) -> contextlib.AbstractContextManager[Any]:
        """The scope of the prefetched generation for ``step`` (a new one, or the one the
        previous driver launched it under), for the duration of its call."""
        scope = self.launched.get(step)
        if scope is None:
            scope = self.launched[step] = self._new_scope()
        return self.call_ids.scope(scope)

    def launch_pending(self, step: int) -> int | None:
        """The earliest step from ``step`` on whose generation has a launch scope but is not
        held by this driver's pipeline: the previous driver launched it, and the replay asks
        for it again under that scope (``None``: there is none)."""
        pending = [s for s in self.launched if s >= step]
        return min(pending) if pending else None

    def forget_launches(self) -> None:
        """Forget every launch scope (a recovery drops the prefetched generations: the
        steps they were for are generated afresh, under new scopes)."""
        self.launched.clear()

    def write(self, state: RunState) -> None:
        """Write ``state`` before the step's first call; forget launch scopes it no longer
        names, and let the workers forget journal entries older than what it may replay."""
        write_run_state(self.folder, state)
        keep = state.scope
        if state.launched_scope is not None:
            keep = min(keep, state.launched_scope)
        self.launched = {s: c for s, c in self.launched.items() if c >= keep}
        self.call_ids.retain_from(keep)

    def record_driver(
        self, groups: Sequence[WorkerGroup[Any]], state: RunState | None = None
    ) -> None:
        """Append this driver to ``run_drivers.jsonl``: its epoch, pid, whether it
        re-attached, the step and scope it takes over (``state``), and for every worker of
        ``groups`` its pid (a re-attach keeps them) and, per method, the last call it
        completed, ``[epoch, scope, key, ok]``: where each group stands; the torn calls
        :meth:`adopt_journals` found (group, scope, key, method, the state on each rank that
        has it, the ranks that never got it); the names of each group's standby spares (a
        re-attach adopts them). The record is logged too; :meth:`amend_driver` adds what the
        driver learns later (its engine servers)."""
        workers: dict[str, list[int] | None] = {}
        last: dict[str, list[dict[str, list[Any]]] | None] = {}
        spares: dict[str, list[str]] = {}
        for group in groups:
            name = group.name_prefix
            standby = getattr(group, "standby_names", None)  # a Ray group's spares
            if isinstance(standby, list):
                spares[name] = [str(n) for n in standby]
            try:
                workers[name] = [int(p) for p in group.execute_all_sync("_get_pid")]
                last[name] = [
                    {m: [r.epoch, r.scope, r.key, r.ok] for m, r in sorted(rank.items())}
                    for rank in group.last_calls()
                ]
            except WorkerDiedError:  # lost while no driver was attached: recovered next
                workers[name] = last[name] = None
        line = {
            "epoch": self.call_ids.epoch,
            "attached": self.attached,
            "driver_pid": os.getpid(),
            "took_over": None if state is None else {"step": state.step, "scope": state.scope},
            "workers": workers,
            "last_calls": last,
            "torn_calls": [
                {
                    "group": c.group,
                    "scope": c.scope,
                    "key": c.key,
                    "method": c.method,
                    "held": {str(r): state for r, state in sorted(c.held.items())},
                    "missing": list(c.missing),
                }
                for c in self.torn_calls
            ],
            "spares": spares,
        }
        with (self.folder / DRIVERS_LOG).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")
        if self.attached:
            logger.info("run %s: where the groups stand: %s", self.run_id, json.dumps(last))

    def amend_driver(self, **facts: Any) -> None:
        """Add ``facts`` to this driver's line of ``run_drivers.jsonl`` (the last one, written
        by :meth:`record_driver`), rewriting the file atomically: what the driver learns
        after recording itself, such as its engine servers' process ids."""
        path = self.folder / DRIVERS_LOG
        lines = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
        last = json.loads(lines[-1]) if lines else {}
        if last.get("epoch") != self.call_ids.epoch or last.get("driver_pid") != os.getpid():
            raise TrainerStateError(
                f"AttachedDriver.amend_driver: the last line of {path} is not this driver's "
                f"(epoch {self.call_ids.epoch}, pid {os.getpid()}); record_driver first"
            )
        lines[-1] = json.dumps({**last, **facts}, sort_keys=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
        os.replace(tmp, path)

    def use_on(self, groups: Sequence[WorkerGroup[Any]]) -> None:
        """Every call of ``groups`` carries an id from this driver."""
        for group in groups:
            group.use_call_ids(self.call_ids)
