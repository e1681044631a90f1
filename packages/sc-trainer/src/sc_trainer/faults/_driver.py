"""Killing the driver on purpose, to test re-attach: ``driver@step=N[:PHASE[+S|+torn]]``.

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
* ``driver@step=3:update_actor+torn``: while the driver hands the phase's first call to a
  group (one that goes to more than one rank) out: rank 0 has it and runs it (a collective,
  which waits for its peers), the other ranks never get it: a *torn* call
  (``sc_core.ext.arm_torn_dispatch``). A phase whose calls all go to one rank ends with
  the kill, as a delay does.

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
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from sc_core.ext import arm_torn_dispatch, disarm_torn_dispatch

from .._errors import TrainerConfigError
from ._workers import is_driver_fault

__all__ = [
    "DRIVER_PHASES",
    "DriverFault",
    "DriverFaults",
    "check_phase_and_delay",
    "matching_parts",
    "step_phase_delay",
]

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
    r"^driver@step=(?P<step>\d+)"
    r"(?::(?P<phase>[a-z_]+)(?:\+(?:(?P<delay>\d+(?:\.\d*)?|\.\d+)|(?P<torn>torn)))?)?$"
)
_GRAMMAR = (
    "driver@step=N[:PHASE[+seconds|+torn]], e.g. 'driver@step=3:update_actor+0.2' or "
    "'driver@step=3:update_actor+torn'"
)


def matching_parts(
    text: str | None, is_kind: Callable[[str], bool], spec: re.Pattern[str], grammar: str
) -> list[re.Match[str]]:
    """The parts of an ``inject_fault`` value (comma-separated) of one kind (``is_kind``),
    each matched by ``spec``; a part of the kind that ``spec`` refuses is a
    :class:`TrainerConfigError` naming ``grammar``."""
    matches = []
    for part in (text or "").split(","):
        if not is_kind(part):
            continue
        match = spec.match(part.strip())
        if match is None:
            raise TrainerConfigError(f"inject_fault must look like {grammar}, got {part!r}")
        matches.append(match)
    return matches


def check_phase_and_delay(kind: str, phase: str, delay_s: float) -> None:
    """A ``kind`` fault's phase is one of :data:`DRIVER_PHASES` and its delay >= 0 s."""
    if phase not in DRIVER_PHASES:
        raise TrainerConfigError(
            f"inject_fault: {kind} phase must be one of {DRIVER_PHASES}, got {phase!r}"
        )
    if not delay_s >= 0:
        raise TrainerConfigError(f"inject_fault: {kind} delay must be >= 0 s, got {delay_s!r}")


def step_phase_delay(match: re.Match[str]) -> tuple[int, str, float]:
    """A matched fault's step, phase (``"start"`` if none) and delay (0 if none)."""
    return int(match["step"]), match["phase"] or "start", float(match["delay"] or 0.0)


@dataclass(frozen=True)
class DriverFault:
    """Kill the driver (SIGKILL) ``delay_s`` seconds into ``phase`` of step ``step``; with
    ``torn``, while it hands the phase's first call out, once rank 0 runs it and before the
    other ranks get it."""

    step: int
    phase: str = "start"
    delay_s: float = 0.0
    torn: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1:
            raise TrainerConfigError(f"inject_fault: driver step must be >= 1, got {self.step!r}")
        check_phase_and_delay("driver", self.phase, self.delay_s)
        if self.torn and (self.delay_s or self.phase == "start"):
            raise TrainerConfigError(
                f"inject_fault: a torn dispatch ({self}) kills the driver inside a phase's "
                "call: give a phase other than 'start', and no delay"
            )

    @classmethod
    def parse_all(cls, text: str | None) -> tuple[DriverFault, ...]:
        """The ``driver@...`` parts of an ``inject_fault`` value (comma-separated)."""
        return tuple(
            cls(*step_phase_delay(match), torn=match["torn"] is not None)
            for match in matching_parts(text, is_driver_fault, _SPEC, _GRAMMAR)
        )

    def __str__(self) -> str:
        how = "+torn" if self.torn else f"+{self.delay_s:g}" if self.delay_s else ""
        return f"driver@step={self.step}:{self.phase}{how}"


def _kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class DriverFaults:
    """The driver faults of one run, each fired once, inside the phase it names.

    :meth:`phase` wraps a phase of a step: a fault without a delay kills the driver as the
    phase begins; one with a delay ``S`` kills it ``S`` seconds into the phase (from a
    timer thread, while the driver waits for the phase's calls), or as the phase ends if it
    ends sooner, before the driver acts on what the phase returned; a torn one kills it
    while it hands the phase's first call to several ranks out, once rank 0 runs it (or as
    the phase ends, if no call of the phase went to several ranks). Either way the driver
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
            if fault.torn:  # the phase's first call to several ranks reaches rank 0 only
                arm_torn_dispatch(_kill_self, reach=1)
                continue
            if fault.delay_s == 0:
                _kill_self()
            timer = threading.Timer(fault.delay_s, _kill_self)
            timer.daemon = True
            timer.start()
        try:
            yield
        finally:
            if due:  # the phase ended before the timer: it dies now, still inside it
                if any(f.torn for f in due) and disarm_torn_dispatch():
                    logger.warning("no call of the phase went to several ranks: not torn")
                _kill_self()

    def at(self, step: int, phase: str) -> None:
        """A phase with no extent (``start``): a fault naming it kills the driver now
        (its delay, if it has one, ends with the phase at once)."""
        with self.phase(step, phase):
            pass


def _announce(fault: DriverFault) -> None:
    how = " while it hands a call out" if fault.torn else ""
    logger.warning("injected fault %s: killing the driver (pid %d)%s", fault, os.getpid(), how)
    for handler in logging.getLogger().handlers:
        handler.flush()
