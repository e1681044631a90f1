"""Killing the driver on purpose, to test re-attach: ``driver@step=N[:PHASE[+S]]``.

A detached run (``TrainerConfig.run``) outlives its driver; to test that, the driver kills
itself with SIGKILL (no clean-up, no ``finally``: what an OOM kill or a lost node does) at
a chosen step and phase:

* ``driver@step=3`` (phase ``start``): as step 3 begins, after its run state is written and
  before its first call;
* ``driver@step=3:update_actor+0.2``: 0.2 s into the step's ``update_actor`` stage, while
  the workers compute (a timer thread fires while the driver waits for the call), or as
  the stage ends if the update takes less: the workers finished it, and the driver dies
  with its result unused. No delay kills it as the stage begins, before its call is sent;
* ``driver@step=3:sync_weights``: between the actor's update and the weight sync;
  ``sync_weights+0.05`` inside the sync;
* ``driver@step=2:save_checkpoint+0.05``: while the workers write a checkpoint.

The phases are the step's stages (the names of the trainer's ``StageTimer``), ``start``,
``validate`` and ``save_checkpoint``. Each fault fires once; the new driver is started
without it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from .._errors import TrainerConfigError
from ._workers import is_driver_fault

__all__ = ["DRIVER_PHASES", "DriverFault", "DriverFaults"]

logger = logging.getLogger(__name__)

#: Where in a step the driver can be killed.
DRIVER_PHASES = (
    "start",
    "generate",
    "balance",
    "reward",
    "old_log_prob",
    "ref_log_prob",
    "values",
    "advantages",
    "update_critic",
    "update_actor",
    "sync_weights",
    "validate",
    "save_checkpoint",
)

_SPEC = re.compile(
    r"^driver@step=(?P<step>\d+)(?::(?P<phase>[a-z_]+)(?:\+(?P<delay>\d+(?:\.\d*)?|\.\d+))?)?$"
)
_GRAMMAR = "driver@step=N[:PHASE[+seconds]], e.g. 'driver@step=3:update_actor+0.2'"


@dataclass(frozen=True)
class DriverFault:
    """Kill the driver (SIGKILL) ``delay_s`` seconds into ``phase`` of step ``step``."""

    step: int
    phase: str = "start"
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise TrainerConfigError(f"inject_fault: driver step must be >= 1, got {self.step!r}")
        if self.phase not in DRIVER_PHASES:
            raise TrainerConfigError(
                f"inject_fault: driver phase must be one of {DRIVER_PHASES}, got {self.phase!r}"
            )
        if not self.delay_s >= 0:
            raise TrainerConfigError(
                f"inject_fault: driver delay must be >= 0 s, got {self.delay_s!r}"
            )

    @classmethod
    def parse_all(cls, text: str | None) -> tuple[DriverFault, ...]:
        """The ``driver@...`` parts of an ``inject_fault`` value (comma-separated)."""
        if text is None:
            return ()
        faults = []
        for part in text.split(","):
            if not is_driver_fault(part):
                continue
            match = _SPEC.match(part.strip())
            if match is None:
                raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {part!r}")
            faults.append(
                cls(int(match["step"]), match["phase"] or "start", float(match["delay"] or 0.0))
            )
        return tuple(faults)

    def __str__(self) -> str:
        delay = f"+{self.delay_s:g}" if self.delay_s else ""
        return f"driver@step={self.step}:{self.phase}{delay}"


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DriverFaults:
    """The driver faults of one run, each fired once, inside the phase it names.

    :meth:`phase` wraps a phase of a step: a fault without a delay kills the driver as the
    phase begins; one with a delay ``S`` kills it ``S`` seconds into the phase (from a
    timer thread, while the driver waits for the phase's calls), or as the phase ends if it
    ends sooner, before the driver acts on what the phase returned. Either way the driver
    dies inside the phase, however quickly the workers answer. Every phase's start is logged
    at DEBUG, fault or not."""

    def __init__(self, faults: tuple[DriverFault, ...]) -> None:
        self.faults = faults
        self._fired: set[DriverFault] = set()

    @contextlib.contextmanager
    def phase(self, step: int, phase: str) -> Iterator[None]:
        """The ``with`` block is phase ``phase`` of step ``step`` (see the class). Its start
        is logged at DEBUG (``step 3: update_actor begins``): a test that acts on the run
        from outside, losing a node inside a phase, waits for that line."""
        logger.debug("step %d: %s begins", step, phase)
        due = [
            f for f in self.faults if f.step == step and f.phase == phase and f not in self._fired
        ]
        for fault in due:
            self._fired.add(fault)
            _announce(fault)
            if fault.delay_s == 0:
                _kill_self()
            timer = threading.Timer(fault.delay_s, _kill_self)
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if due:  # the phase ended before the timer: it dies now, still inside it
                _kill_self()

    def at(self, step: int, phase: str) -> None:
        """A phase with no extent (``start``): a fault naming it kills the driver now
        (its delay, if it has one, ends with the phase at once)."""
        with self.phase(step, phase):
            pass


def _announce(fault: DriverFault) -> None:
    logger.warning("injected fault %s: killing the driver (pid %d)", fault, os.getpid())
    for handler in logging.getLogger().handlers:
        handler.flush()
