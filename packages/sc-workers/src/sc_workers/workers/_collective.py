"""Worker methods that run collectives, and what happens when one of them fails on one rank.

``@collective`` wraps a registered worker method (under ``@register``) so that, in a group of
several ranks:

* before it runs, the worker catches up with a failure elsewhere: if a peer published a
  failure of the current process groups, it tears them down; if they are torn down, it joins
  the next generation and rebuilds its engines from the state it kept
  (:meth:`WorkerBase._catch_up <sc_workers.workers._common.WorkerBase._catch_up>`);
* when it raises, the worker publishes its rank and error and tears every process group of
  its process down (:mod:`sc_workers.engine._groups`), so that no peer waits in a collective
  for ``SC_WORKERS_PG_TIMEOUT_S``; it re-raises its own error, with a note naming its rank;
* when a collective of it failed because a peer did, it tears down its groups too and raises
  :class:`~sc_workers.CollectiveAbortedError` (a pipeline stage:
  :class:`~sc_workers.PipelineStageError`) naming the rank that failed and its error.

``@collective_setup`` (``init_model``) catches up the same way, and does not tear down on
an error: a set-up error (a layout the engine cannot run) is the same on every rank.
"""

from __future__ import annotations

import functools
import traceback
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

import torch.distributed as dist

__all__ = [
    "CollectiveWorker",
    "add_note",
    "collective",
    "collective_setup",
    "detach_traceback",
    "error_summary",
    "is_peer_failure",
]

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class CollectiveWorker(Protocol):
    """What :func:`collective` needs of a worker (``WorkerBase`` has it)."""

    def _collective_call(self, method: str, run: Callable[[], T], tear_down: bool) -> T: ...


W = TypeVar("W", bound=CollectiveWorker)

#: what a collective raises when its peer's connections closed or broke (gloo, nccl)
_PEER_MARKERS = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "socket closed",
    "pair closure",
    "communicator was aborted",
    "ncclremoteerror",
    "ncclsystemerror",
)


def collective(method: Callable[Concatenate[W, P], R]) -> Callable[Concatenate[W, P], R]:
    """A worker method whose collectives a failure on one rank must not strand (see the
    module docstring)."""
    name = method.__name__

    def guarded(self: W, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._collective_call(name, lambda: method(self, *args, **kwargs), True)

    return functools.wraps(method)(guarded)  # type: ignore[return-value]  # same signature


def collective_setup(method: Callable[Concatenate[W, P], R]) -> Callable[Concatenate[W, P], R]:
    """A set-up method: catches up with a failure elsewhere before it runs, and does not
    tear the groups down when it raises."""
    name = method.__name__

    def guarded(self: W, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._collective_call(name, lambda: method(self, *args, **kwargs), False)

    return functools.wraps(method)(guarded)  # type: ignore[return-value]  # same signature


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    todo: list[BaseException | None] = [exc]
    while todo:
        item = todo.pop()
        if item is None or any(item is s for s in seen):
            continue
        seen.append(item)
        todo.extend((item.__cause__, item.__context__))
    return seen


def is_peer_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective that failed because a peer's connection closed or
    broke (or an sc-workers error that says a peer caused it)."""
    for item in _chain(exc):
        said = getattr(item, "sc_caused_by_peer", None)
        if isinstance(said, bool):
            if said:
                return True
            continue  # an sc-workers error that says it is this rank's own
        head = "\n".join(str(item).splitlines()[:2]).lower()
        if isinstance(item, dist.DistError) or any(m in head for m in _PEER_MARKERS):
            return True
    return False


def error_summary(exc: BaseException, limit: int = 500) -> str:
    """``Type: first line of the message``, at most ``limit`` characters."""
    lines = str(exc).strip().splitlines()
    text = f"{type(exc).__name__}: {lines[0] if lines else ''}".rstrip(": ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def detach_traceback(exc: BaseException) -> str:
    """Format ``exc`` with its traceback (and the errors chained to it), then drop the
    tracebacks: their frames hold the engines, the batch's tensors and the schedule (a frame
    keeps its function, and a closure its variables, even once cleared), and through them the
    process groups, whose connections close only once nothing references them. Returns the
    formatted text."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    for item in _chain(exc):
        item.__traceback__ = None
    return text


def add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)`` (Python 3.11+; on 3.10 the note is only kept in ``__notes__``)."""
    adder = getattr(exc, "add_note", None)
    if callable(adder):
        adder(note)
        return
    notes = getattr(exc, "__notes__", None)
    try:
        if isinstance(notes, list):
            notes.append(note)
        else:
            exc.__notes__ = [note]  # type: ignore[attr-defined,unused-ignore]  # 3.10 has no add_note
    except AttributeError:  # pragma: no cover - an exception without a __dict__
        pass
