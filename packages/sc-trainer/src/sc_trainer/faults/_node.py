"""Losing a whole node on purpose, to test recovery from it: ``node[:R]@step=N[:PHASE[+S]]``.

A machine that goes away takes every process on it: its ranks, their spares, an engine
server there. With the Ray backend the run can do that to one of its own nodes (sc-ray's
``NodeLoss``: the node's raylet and every process below it are stopped and SIGKILLed
together, with no clean-up):

* ``node@step=3``: as step 3 begins, the node of the highest actor rank that does not run on
  the driver's node (the driver's own node is never lost: the driver would go with it);
* ``node:1@step=3``: the node actor rank 1 runs on;
* ``node@step=3:update_actor``: as the step's ``update_actor`` phase begins, before its call
  is sent; ``update_actor+0.5`` 0.5 s into it, while the workers compute (a timer thread
  fires while the driver waits for the call), or as the phase ends if it ends sooner,
  before the driver acts on what it returned.

The phases are the driver faults' (:data:`~sc_trainer.faults.DRIVER_PHASES`). The loss is
armed as the step begins (a process that reserves nothing starts on the node and waits), so
that it fires at once inside the phase. The run then recovers in place like after any death
(docs/guides/fault-tolerance.md, "Losing a node"). Each fault fires once.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from .._errors import TrainerConfigError, TrainerStateError
from ._driver import check_phase_and_delay, matching_parts, step_phase_delay
from ._workers import NODE_PREFIX, is_node_fault

__all__ = ["ArmedLoss", "NodeFault", "NodeFaults"]

logger = logging.getLogger(__name__)

_SPEC = re.compile(
    r"^node(?::(?P<rank>\d+))?@step=(?P<step>\d+)"
    r"(?::(?P<phase>[a-z_]+)(?:\+(?P<delay>\d+(?:\.\d*)?|\.\d+))?)?$"
)
_GRAMMAR = "node[:RANK]@step=N[:PHASE[+seconds]], e.g. 'node@step=3:update_actor+0.5'"


@dataclass(frozen=True)
class NodeFault:
    """Lose the node of actor rank ``rank`` (``None``: the highest actor rank not on the
    driver's node) ``delay_s`` seconds into ``phase`` of step ``step``."""

    step: int
    phase: str = "start"
    delay_s: float = 0.0
    rank: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise TrainerConfigError(f"inject_fault: node step must be >= 1, got {self.step!r}")
        if self.rank is not None and (
            isinstance(self.rank, bool) or not isinstance(self.rank, int) or self.rank < 0
        ):
            raise TrainerConfigError(f"inject_fault: node rank must be >= 0, got {self.rank!r}")
        check_phase_and_delay("node", self.phase, self.delay_s)
        if self.phase == "start" and self.delay_s:
            raise TrainerConfigError(
                f"inject_fault: the node is lost as step {self.step} starts; a delay needs a "
                f"phase ({_GRAMMAR})"
            )

    @classmethod
    def parse_all(cls, text: str | None) -> tuple[NodeFault, ...]:
        """The ``node...@`` parts of an ``inject_fault`` value (comma-separated)."""
        return tuple(
            cls(*step_phase_delay(match), None if match["rank"] is None else int(match["rank"]))
            for match in matching_parts(text, is_node_fault, _SPEC, _GRAMMAR)
        )

    def __str__(self) -> str:
        who = NODE_PREFIX if self.rank is None else f"{NODE_PREFIX}:{self.rank}"
        delay = f"+{self.delay_s:g}" if self.delay_s else ""
        return f"{who}@step={self.step}:{self.phase}{delay}"


class ArmedLoss(Protocol):
    """A node armed to be lost (sc-ray's ``NodeLoss``)."""

    def fire(self) -> None: ...

    def cancel(self) -> None: ...


class _Armed:
    """One armed fault: fired once, from the phase or from its timer, whichever is first."""

    def __init__(self, fault: NodeFault, loss: ArmedLoss) -> None:
        self.fault = fault
        self.loss = loss
        self._lock = threading.Lock()
        self.fired = False
        self.error: BaseException | None = None

    def fire(self) -> None:
        with self._lock:
            if self.fired:
                return
            self.fired = True
            logger.warning("injected fault %s: losing the node", self.fault)
            try:
                self.loss.fire()
            except Exception as exc:  # kept for the phase's end (a timer thread has no caller)
                logger.error("injected fault %s: the node was not lost: %s", self.fault, exc)
                self.error = exc


class NodeFaults:
    """The node faults of one run: armed as their step begins (:meth:`arm`), fired inside
    the phase they name (:meth:`phase`), each once; :meth:`close` stands down the rest."""

    def __init__(self, faults: tuple[NodeFault, ...]) -> None:
        self.faults = faults
        self._armed: list[_Armed] = []
        self._done: set[NodeFault] = set()

    def arm(self, step: int, arm: Callable[[NodeFault], ArmedLoss]) -> None:
        """As step ``step`` begins: arm its faults (``arm`` starts the loss on the fault's
        node) and fire those of phase ``start``."""
        for fault in self.faults:
            if fault.step != step or fault in self._done:
                continue
            if not any(a.fault == fault for a in self._armed):
                logger.info("step %d: arming the fault %s", step, fault)
                self._armed.append(_Armed(fault, arm(fault)))
        self._fire_now(step, "start")

    def _due(self, step: int, phase: str) -> list[_Armed]:
        return [a for a in self._armed if a.fault.step == step and a.fault.phase == phase]

    def _fire_now(self, step: int, phase: str) -> None:
        for armed in self._due(step, phase):
            self._finish(armed)

    def _finish(self, armed: _Armed) -> None:
        armed.fire()
        self._armed.remove(armed)
        self._done.add(armed.fault)
        if armed.error is not None:
            raise TrainerStateError(
                f"inject_fault {armed.fault}: the node was not lost: {armed.error}"
            ) from armed.error

    @contextlib.contextmanager
    def phase(self, step: int, phase: str) -> Iterator[None]:
        """The ``with`` block is phase ``phase`` of step ``step``: an armed fault without a
        delay fires as it begins; one with a delay ``S`` fires ``S`` seconds into it (a
        timer thread), or as it ends if it ends sooner."""
        due = self._due(step, phase)
        timers = []
        for armed in due:
            if armed.fault.delay_s == 0:
                self._finish(armed)
                continue
            timer = threading.Timer(armed.fault.delay_s, armed.fire)
            timer.daemon = True
            timer.start()
            timers.append((timer, armed))
        try:
            yield
        finally:
            for timer, armed in timers:
                timer.cancel()
                with contextlib.suppress(TrainerStateError):
                    self._finish(armed)  # fires it now unless the timer did
        for _, armed in timers:
            if armed.error is not None:  # the phase itself ended well
                raise TrainerStateError(
                    f"inject_fault {armed.fault}: the node was not lost: {armed.error}"
                ) from armed.error

    def close(self) -> None:
        """Stand down every fault armed and not fired (the run ended first)."""
        for armed in self._armed:
            armed.loss.cancel()
        self._armed.clear()
