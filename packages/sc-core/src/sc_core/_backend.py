"""The backend contract: what a worker group asks of the machinery that runs its workers.

A worker group (:class:`~sc_core.WorkerGroup`) binds methods, dispatches and collects; it
*holds* a :class:`Backend` that runs the workers. The group hands every call to the backend
explicitly, as a :class:`~sc_core.Call` (ranks, deadline, span), and gets back one
:class:`CallHandle` that carries everything the wait or pending step needs: no state travels
beside the call.

The backend's part in one call (see ``_call_path.py``)::

    handle = backend.start(call, method_name, rank_args)   # returns at once
    values = backend.wait(handle)                          # blocking calls
    futures = backend.pending(handle)                      # non-blocking calls

``LocalBackend`` (this package) and sc-ray's ``RayBackend`` implement it; a test or a third
backend implements the seven methods below and passes an instance to
``WorkerGroup._attach_backend``. A backend that can start a new worker in place of a dead
one also implements :class:`ReplacingBackend` (``WorkerGroup.replace_ranks`` needs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ._call import Call

__all__ = ["Backend", "CallHandle", "RankArgs", "ReplacedWorkers", "ReplacingBackend"]

#: The positional and keyword arguments one rank receives.
RankArgs = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(eq=False)
class CallHandle:
    """One started call.

    ``rank_handles[i]`` is the backend's handle of rank ``call.ranks[i]`` (a Ray
    ``ObjectRef``, a :class:`~sc_core.LocalHandle`...): verl's ``execute_all_async`` returns
    them. ``state`` is whatever else the backend needs later for this call (for example
    sc-ray's references to the row counts of a non-blocking call's shards).
    """

    call: Call
    rank_handles: list[Any]
    state: Any = field(default=None)


@runtime_checkable
class Backend(Protocol):
    """Runs the workers of one worker group.

    Errors: :meth:`wait` raises :class:`~sc_core.WorkerError` for an exception in a worker
    (the lowest failing rank reported, the others listed), :class:`~sc_core.WorkerDiedError`
    for dead workers (the group records them as dead) and
    :class:`~sc_core.CallTimeoutError` naming the ranks that had not answered by the call's
    deadline. Backend handles of finished calls answer :meth:`is_done` with ``True``.
    """

    def start(self, call: Call, method_name: str, rank_args: Sequence[RankArgs]) -> CallHandle:
        """Start ``method_name`` on every rank of ``call.ranks`` (``rank_args[i]`` on
        ``call.ranks[i]``) and return at once."""
        ...

    def wait(self, handle: CallHandle) -> list[Any]:
        """The values of the call, one per rank of ``handle.call.ranks``, waited for within
        the call's deadline."""
        ...

    def pending(self, handle: CallHandle) -> list[Any]:
        """For a non-blocking call: one future per rank that the mode's collect function can
        join (futures that know their row counts when ``handle.call.row_aligned``)."""
        ...

    def is_done(self, rank_handle: Any) -> bool:
        """Whether the call behind one rank handle has finished (``True`` if unknowable)."""
        ...

    def cancel(self, rank_handle: Any) -> bool:
        """Ask to stop the call behind one rank handle; whether the backend could ask."""
        ...

    def is_alive(self, rank: int) -> bool:
        """Whether the worker of ``rank`` is running."""
        ...

    def close(self) -> None:
        """Stop every worker and free what the backend holds; a second call does nothing."""
        ...


@dataclass(frozen=True)
class ReplacedWorkers:
    """What :meth:`ReplacingBackend.replace` did: the new worker handle of each replaced
    rank, and the rendezvous address the whole group re-forms its collectives at."""

    workers: dict[int, Any]
    master_addr: str | None
    master_port: str | None


@runtime_checkable
class ReplacingBackend(Protocol):
    """A backend that can put new workers in place of ranks (optional, beside
    :class:`Backend`)."""

    def replace(self, ranks: Sequence[int], timeout: float) -> ReplacedWorkers:
        """Stop what is left of the workers of ``ranks`` and start new ones in their
        places (same rank, world size, placement and environment, except a new
        MASTER_ADDR/MASTER_PORT that every rank re-forms at), waiting up to ``timeout``
        seconds for their constructors; raise (and leave nothing half-started) otherwise.
        ``Backend.is_alive`` is true for them afterwards."""
        ...
