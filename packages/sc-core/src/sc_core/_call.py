"""``Call``: the per-call object a worker group passes to its backend hooks."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sc_dispatch import Execute

from ._call_ids import CallId
from ._errors import InvalidCallOptionsError
from ._spans import new_span

__all__ = ["Call", "CallOptions"]


def check_timeout(where: str, timeout: object) -> float | None:
    """``timeout`` as a positive finite float, or ``None`` (no deadline)."""
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)):
        raise InvalidCallOptionsError(
            f"{where}: timeout must be a number of seconds or None, "
            f"got {type(timeout).__qualname__} {timeout!r}"
        )
    if not math.isfinite(timeout) or timeout <= 0:
        raise InvalidCallOptionsError(
            f"{where}: timeout must be a positive finite number of seconds, got {timeout!r}"
        )
    return float(timeout)


@dataclass(frozen=True)
class CallOptions:
    """Per-call overrides set with ``proxy.options(...)``.

    ``timeout`` applies only when ``has_timeout`` (``None`` then means no deadline), else the
    group's ``default_timeout`` does; ``blocking=None`` keeps the method's registered value;
    ``in_order`` makes ``proxy.stream(...)`` yield its shards in input order rather than as
    they finish.
    """

    timeout: float | None = None
    has_timeout: bool = False
    blocking: bool | None = None
    in_order: bool = False


class Call:
    """One call on a worker group, as its backend sees it.

    ``method_name`` is the worker method called; ``ranks`` the ranks it runs on;
    ``execute_mode`` ``Execute.ALL`` or ``Execute.RANK_ZERO``; ``blocking`` whether the
    driver waits; ``timeout`` the call's time limit in seconds (``None``: none) and
    ``deadline`` the same as a ``time.monotonic()`` instant; ``span`` the
    :class:`~sc_core.CallSpan` being recorded, to which a backend adds per-rank phases and
    byte counts (a shared span that records nothing while no observer is registered:
    ``span.recording`` tells); ``row_aligned`` whether the mode's outputs are row shards of
    the input (:attr:`sc_dispatch.DispatchModeSpec.row_aligned`): a non-blocking call then needs
    futures that know their row counts, other modes take the backend's plain handles.
    ``call_id`` is the call's :class:`~sc_core.CallId` when its group uses call ids
    (``None`` otherwise): each rank then receives it under the reserved keyword
    ``_sc_call_id`` (a free unit's part carries the unit's own id).
    """

    __slots__ = (
        "blocking",
        "call_id",
        "deadline",
        "execute_mode",
        "method_name",
        "ranks",
        "row_aligned",
        "span",
        "timeout",
    )

    def __init__(
        self,
        *,
        group: str,
        method_name: str,
        ranks: tuple[int, ...],
        execute_mode: Execute,
        blocking: bool,
        timeout: float | None,
        row_aligned: bool = False,
        call_id: CallId | None = None,
    ) -> None:
        self.method_name = method_name
        self.call_id = call_id
        self.row_aligned = row_aligned
        self.ranks = ranks
        self.execute_mode = execute_mode
        self.blocking = blocking
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout
        self.span = new_span(group, method_name, blocking, ranks)

    def part(self, ranks: tuple[int, ...], unit: int | None = None) -> Call:
        """The same call on ``ranks`` only, sharing this call's deadline, span and id: one
        unit of a call (see ``_units.py``); with ``unit``, the part of free unit ``unit``,
        whose id is that unit's own (:meth:`CallId.unit <sc_core.CallId.unit>`)."""
        part = object.__new__(Call)
        for name in Call.__slots__:
            setattr(part, name, getattr(self, name))
        part.ranks = ranks
        if unit is not None and self.call_id is not None:
            part.call_id = self.call_id.unit(unit)
        return part

    def remaining(self) -> float | None:
        """Seconds left before the deadline (never negative), or ``None`` if there is none."""
        if self.deadline is None:
            return None
        return max(0.0, self.deadline - time.monotonic())

    def expired(self) -> bool:
        """Whether the deadline has passed."""
        return self.deadline is not None and time.monotonic() >= self.deadline

    def __repr__(self) -> str:
        return (
            f"Call({self.method_name!r}, ranks={list(self.ranks)}, blocking={self.blocking}, "
            f"timeout={self.timeout})"
        )
