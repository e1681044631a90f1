"""Faults injected into workers on purpose, to test recovery: :meth:`WorkerGroup.inject_fault`.

``group.inject_fault(rank, "update_actor", action="kill", delay_s=0.2)`` arms one fault on
one rank: the next time that rank starts ``update_actor`` (through any call path: a bound
method, ``execute_all``, a spawned view's plain name), the fault fires, once:

* ``"kill"``: the worker's process exits ``delay_s`` seconds after the method began (at once
  for ``0``), wherever the method then is: computing, inside a collective, writing a
  checkpoint in the background. The in-process backend, whose workers share the driver's
  process, lets the method run and then reports the rank dead, as
  ``LocalWorkerGroup.kill_worker`` does.
* ``"raise"``: the method raises :class:`InjectedFaultError` before it runs (``delay_s``
  must be ``0``); the driver sees a :class:`~sc_core.WorkerError` for it.

The fault lives in the worker (``Worker._sc_arm_fault`` stores it; a backend asks
``Worker._sc_take_fault`` when a method starts), so it needs no code path of the library
that only tests take. A replacement worker starts with no fault armed.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from ._errors import ConfigTypeError, InjectedFaultError, InvalidConfigError, UnknownMethodError

__all__ = ["ARM_METHOD", "FAULT_ACTIONS", "ArmedFault", "FaultAction", "inject_fault", "take_fault"]

logger = logging.getLogger("sc_core.faults")

FaultAction = Literal["kill", "raise"]
#: What an injected fault may do.
FAULT_ACTIONS: tuple[FaultAction, ...] = ("kill", "raise")
#: The worker method that arms a fault (``Worker._sc_arm_fault``).
ARM_METHOD = "_sc_arm_fault"
#: The exit status of a worker process an injected fault killed.
KILLED_EXIT_STATUS = 70


@dataclass(frozen=True)
class ArmedFault:
    """One fault armed on one rank: fire when ``method`` (the name the worker runs) starts."""

    method: str
    action: FaultAction
    delay_s: float = 0.0

    def __post_init__(self) -> None:
        where = f"inject_fault({self.method!r})"
        if self.action not in FAULT_ACTIONS:
            raise InvalidConfigError(
                f"{where}: action must be one of {FAULT_ACTIONS}, got {self.action!r}"
            )
        delay = self.delay_s
        if isinstance(delay, bool) or not isinstance(delay, (int, float)):
            raise ConfigTypeError(f"{where}: delay_s must be a number, got {delay!r}")
        if not math.isfinite(delay) or delay < 0:
            raise InvalidConfigError(f"{where}: delay_s must be finite and >= 0, got {delay!r}")
        if self.action == "raise" and delay:
            raise InvalidConfigError(
                f"{where}: a raised fault fires as the method starts; delay_s must be 0, "
                f"got {delay!r}"
            )

    def fire_in_process(self, rank: int) -> None:
        """Fire in a worker process of its own: exit it (now or after ``delay_s`` on a timer
        thread), or raise :class:`InjectedFaultError`."""
        if self.action == "raise":
            raise InjectedFaultError(f"{self.method} (rank {rank}): injected fault")
        logger.warning(
            "rank %d: injected fault: exiting %.3g s into %s", rank, self.delay_s, self.method
        )
        if self.delay_s == 0:
            os._exit(KILLED_EXIT_STATUS)
        timer = threading.Timer(self.delay_s, os._exit, (KILLED_EXIT_STATUS,))
        timer.daemon = True
        timer.start()


def take_fault(worker: object, method_name: str, args: tuple[object, ...]) -> ArmedFault | None:
    """The fault armed on ``worker`` for the method a call starts (disarmed), else ``None``;
    for a fused worker's ``_fuw_execute``, the method it names. Backends call it."""
    armed = getattr(worker, "__dict__", {}).get("_sc_armed_faults")
    if not armed:  # every call asks: nothing armed costs one dict lookup
        return None
    take = getattr(worker, "_sc_take_fault", None)
    if take is None:
        return None
    if method_name == "_fuw_execute" and args and isinstance(args[0], str):
        method_name = args[0]
    fault: ArmedFault | None = take(method_name)
    return fault


class _Armable(Protocol):
    """What arming a fault uses of a worker group."""

    name_prefix: str

    @property
    def world_size(self) -> int: ...

    def _sc_method_target(self, name: str) -> str | None: ...

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]: ...


def inject_fault(
    group: _Armable, rank: int, method: str, action: FaultAction, delay_s: float
) -> None:
    """See :meth:`WorkerGroup.inject_fault`."""
    where = f"{type(group).__name__} {group.name_prefix!r}.inject_fault"
    if isinstance(rank, bool) or not isinstance(rank, int):
        raise ConfigTypeError(f"{where}: rank must be an int, got {rank!r}")
    if not 0 <= rank < group.world_size:
        raise InvalidConfigError(
            f"{where}: rank {rank} is outside the group's world size {group.world_size}"
        )
    if not isinstance(method, str):
        raise ConfigTypeError(f"{where}: method must be a str, got {method!r}")
    target = group._sc_method_target(method)
    if target is None:
        raise UnknownMethodError(f"{where}: {method!r} is no method bound on this group")
    fault = ArmedFault(target, action, delay_s)
    group.execute_all_sync(ARM_METHOD, rank, fault)
    logger.warning(
        "worker group %s: armed an injected fault on rank %d: %s %s",
        group.name_prefix,
        rank,
        fault.action,
        f"{fault.delay_s:g} s into {method}" if fault.action == "kill" else f"in {method}",
    )
