"""The exceptions sc-core raises, and that every backend (sc-ray included) raises too.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`ScCoreError` and exactly one builtin exception, the one it means,
so callers may catch either::

    ScCoreError (Exception)                    base class of everything below
    ├── WorkerError (RuntimeError)             a worker method raised: names the method, the
    │                                          first failing rank, the original exception
    │                                          type and the remote traceback; lists the other
    │                                          failing ranks. The instance is also an instance
    │                                          of the worker's exception class, so
    │                                          ``except ValueError`` keeps working
    ├── WorkerDiedError (RuntimeError)         a worker process is gone: names the ranks and
    │                                          the method that found out
    ├── InjectedFaultError (RuntimeError)      raised in a worker by a fault armed with
    │                                          ``WorkerGroup.inject_fault(action="raise")``,
    │                                          or by a call torn on purpose (``sc_core.ext.
    │                                          arm_torn_dispatch``)
    ├── StaleDriverError (RuntimeError)        raised in a worker for a call whose id is of
    │                                          an older driver epoch than one it has seen (a
    │                                          newer driver re-attached): names the method,
    │                                          the rank and both epochs
    ├── CallTimeoutError (TimeoutError)        a call passed its deadline: names the method,
    │                                          the ranks that had not answered, the timeout
    ├── RendezvousError (RuntimeError)         rank 0 could not publish MASTER_ADDR/PORT, or
    │                                          published twice
    ├── RendezvousTimeoutError (TimeoutError)  a rank waited too long for rank 0
    ├── WorkerGroupError (RuntimeError)        a group used in a state it cannot serve
    │   │                                      (no workers, unknown backend handle)
    │   └── WorkerGroupClosedError             a call on a group after ``close()``
    ├── UnsupportedCallError (TypeError)       a call its dispatch mode cannot make: a stream
    │                                          of a mode that does not cut the batch into
    │                                          units, a non-blocking call of a scheduled mode
    ├── BackendNotImplementedError             a worker group subclass that binds methods but
    │   (NotImplementedError)                  lacks the backend hook a call needs
    ├── UnknownMethodError (AttributeError)    a worker-group attribute that is no bound method
    ├── InvalidConfigError (ValueError)        a bad value given to an sc-core constructor or
    │   │                                      option
    │   ├── ResourcePoolError                  an empty pool, zero/negative process counts
    │   ├── InvalidCallOptionsError            ``.options(timeout=-1)``
    │   └── ColocationError                    a role exposed twice, a role name that is not
    │                                          an identifier
    ├── ConfigTypeError (TypeError)            an argument of the wrong type: a class that is
    │                                          not a ``Worker`` to colocate, ``blocking="yes"``
    ├── MethodCollisionError (TypeError)       a worker class whose method would replace an
    │                                          attribute the framework relies on (a worker
    │                                          group attribute, a reserved ``Worker`` name)
    ├── UnknownRoleError (KeyError)            ``spawn`` / ``spawn_fused`` of a role the
    │                                          colocated class does not have, or a role a
    │                                          ``ResourcePoolManager`` maps to no pool
    ├── WorkerEnvironmentError (ValueError)    a worker environment that cannot be used:
    │   │                                      RANK >= WORLD_SIZE, RANK="x", ...
    │   └── VisibleDevicesError                CUDA/HIP/ROCR_VISIBLE_DEVICES that disagree
    ├── MissingEnvironmentError (KeyError)     WORLD_SIZE or RANK not set
    ├── MeshRegistrationError (ValueError)     a mesh registered twice on one worker
    └── UnknownMeshError (KeyError)            a mesh queried that was never registered

Messages name the method, the rank and the offending value.
"""

from __future__ import annotations

import pickle
import re
import threading
import traceback
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "BackendNotImplementedError",
    "CallTimeoutError",
    "ColocationError",
    "ConfigTypeError",
    "InjectedFaultError",
    "InvalidCallOptionsError",
    "InvalidConfigError",
    "MeshRegistrationError",
    "MethodCollisionError",
    "MissingEnvironmentError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "ResourcePoolError",
    "ScCoreError",
    "StaleDriverError",
    "UnknownMeshError",
    "UnknownMethodError",
    "UnsupportedCallError",
    "UnknownRoleError",
    "VisibleDevicesError",
    "WorkerDiedError",
    "WorkerEnvironmentError",
    "WorkerError",
    "WorkerGroupClosedError",
    "WorkerGroupError",
]


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour and cursor codes (``\\x1b[31m`` ...)."""
    return _ANSI.sub("", text)


class ScCoreError(Exception):
    """Base class of every error raised by sc-core and by the backends built on it."""


class _KeyErrorMessage(KeyError):
    """A KeyError whose ``str()`` is its message, not the message's ``repr``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _ranks_text(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


class InjectedFaultError(ScCoreError, RuntimeError):
    """What a worker method raises when a fault armed with ``WorkerGroup.inject_fault(...,
    action="raise")`` fires; the driver receives it inside a :class:`WorkerError`. Also
    what a call raises on the driver after a torn dispatch injected with
    ``sc_core.ext.arm_torn_dispatch`` (whose ``then`` returned)."""


class StaleDriverError(ScCoreError, RuntimeError):
    """A call from an older driver than one the worker has seen (its call id's epoch is
    lower): a newer driver re-attached to this run, and the old one is fenced off."""


class WorkerError(ScCoreError, RuntimeError):
    """A worker method raised an exception.

    Attributes: ``method`` (the method name), ``rank`` (the failing rank whose error is
    reported: the lowest one whose error is its own, not the consequence of another rank's
    failure, see :func:`~sc_core.backend.reported_rank`), ``error_type`` (the original
    exception's class name), ``error_message``, ``remote_traceback`` (the traceback text as
    formatted where the error happened), ``other_failed_ranks`` and ``cause`` (the original
    exception object when the backend could recover it, else ``None``; it is also chained
    as ``__cause__``).

    When ``cause`` is given, the error is an instance of a subclass of both
    ``WorkerError`` and ``type(cause)`` (``isinstance(err, ValueError)`` holds for a worker
    that raised ``ValueError``), so ``except ValueError:`` or ``except
    torch.OutOfMemoryError:`` on the driver keep working. Exception classes that cannot be
    combined with it (those with a C layout of their own: ``OSError`` and its subclasses,
    ``AttributeError``, ``ImportError``, ...) give a plain ``WorkerError``; ``cause`` still
    holds the original.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> WorkerError:
        cause = kwargs.get("cause")
        target = _mirror_class(cls, type(cause)) if isinstance(cause, BaseException) else cls
        instance: WorkerError = super().__new__(target, *args)
        return instance

    def __init__(
        self,
        method: str,
        rank: int,
        error_type: str,
        error_message: str,
        remote_traceback: str,
        *,
        other_failed_ranks: Sequence[int] = (),
        cause: BaseException | None = None,
    ) -> None:
        # Remote tracebacks arrive with terminal colour codes (Ray adds them): plain text here.
        error_message = strip_ansi(error_message)
        remote_traceback = strip_ansi(remote_traceback)
        self.method = method
        self.rank = rank
        self.error_type = error_type
        self.error_message = error_message
        self.remote_traceback = remote_traceback
        self.other_failed_ranks = tuple(other_failed_ranks)
        self.cause = cause
        text = f"{method} failed on rank {rank}: {error_type}: {error_message}"
        if self.other_failed_ranks:
            text += f" (also failed on {_ranks_text(self.other_failed_ranks)})"
        if remote_traceback:
            text += f"\n\nRemote traceback (rank {rank}):\n{remote_traceback.rstrip()}"
        Exception.__init__(self, text)
        if cause is not None:
            self.__cause__ = cause

    def __str__(self) -> str:
        # The cause's class may define its own __str__ (KeyError quotes its argument).
        return str(self.args[0]) if self.args else ""

    @classmethod
    def from_exception(
        cls,
        method: str,
        rank: int,
        exc: BaseException,
        *,
        other_failed_ranks: Sequence[int] = (),
        remote_traceback: str | None = None,
    ) -> WorkerError:
        """Build the error from the exception a worker raised (its traceback is formatted)."""
        if remote_traceback is None:
            remote_traceback = "".join(
                traceback.format_exception(type(exc), exc, exc.__traceback__)
            )
        return cls(
            method,
            rank,
            type(exc).__qualname__,
            str(exc),
            remote_traceback,
            other_failed_ranks=other_failed_ranks,
            cause=exc,
        )

    @property
    def base_class(self) -> type[WorkerError]:
        """The ``WorkerError`` class this error was built as (without the cause's class)."""
        kind = type(self)
        base: type[WorkerError] = kind.__dict__.get("_sc_base", kind)
        return base

    def with_other_failed_ranks(self, ranks: Sequence[int]) -> WorkerError:
        """The same error with ``ranks`` listed as the other failing ranks."""
        return self.base_class(
            self.method,
            self.rank,
            self.error_type,
            self.error_message,
            self.remote_traceback,
            other_failed_ranks=ranks,
            cause=self.cause,
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_worker_error,
            (
                self.base_class,
                self.method,
                self.rank,
                self.error_type,
                self.error_message,
                self.remote_traceback,
                self.other_failed_ranks,
                _picklable_or_none(self.cause),
            ),
        )


_mirror_lock = threading.Lock()
_mirrors: dict[tuple[type[WorkerError], type[BaseException]], type[WorkerError]] = {}


def _mirror_class(base: type[WorkerError], cause_type: type[BaseException]) -> type[WorkerError]:
    """``base`` combined with ``cause_type`` (cached), or ``base`` itself where the two
    cannot be combined, or where ``cause_type`` is no plain exception class."""
    if issubclass(base, cause_type) or not issubclass(cause_type, Exception):
        return base
    key = (base, cause_type)
    with _mirror_lock:
        found = _mirrors.get(key)
        if found is None:
            try:
                found = type(
                    f"{base.__name__}[{cause_type.__qualname__}]",
                    (base, cause_type),
                    {"__module__": base.__module__, "_sc_base": base},
                )
                Exception.__new__(found)  # OSError & co. refuse to be built this way
            except TypeError:  # an instance lay-out conflict (AttributeError, OSError, ...)
                found = base
            _mirrors[key] = found
    return found


def _picklable_or_none(value: BaseException | None) -> BaseException | None:
    """``value`` if it pickles (so that the other side can rebuild the combined class),
    else ``None``: the error's text and traceback travel either way."""
    if value is None:
        return None
    try:
        pickle.dumps(value)
    except Exception:
        return None
    return value


def _rebuild_worker_error(
    cls: type[WorkerError],
    method: str,
    rank: int,
    error_type: str,
    error_message: str,
    remote_traceback: str,
    other_failed_ranks: Sequence[int],
    cause: BaseException | None = None,
) -> WorkerError:
    return cls(
        method,
        rank,
        error_type,
        error_message,
        remote_traceback,
        other_failed_ranks=other_failed_ranks,
        cause=cause,
    )


#: The attribute (on an exception class or instance) that marks a worker's error as the
#: consequence of another rank's failure: a collective or a send whose peer is gone.
CAUSED_BY_PEER_ATTR = "sc_caused_by_peer"


def caused_by_peer(error: BaseException | None) -> bool:
    """Whether ``error`` (or, for a :class:`WorkerError`, the worker's exception it carries)
    says it failed because another rank did (``sc_caused_by_peer = True``)."""
    if error is None:
        return False
    if getattr(error, CAUSED_BY_PEER_ATTR, False) is True:
        return True
    cause = error.cause if isinstance(error, WorkerError) else None
    return cause is not None and getattr(cause, CAUSED_BY_PEER_ATTR, False) is True


def reported_rank(errors: Mapping[int, BaseException | None]) -> int:
    """The rank whose error a call that failed on several ranks reports: the lowest rank
    whose error is its own, or, when every error says a peer caused it, the lowest rank.
    ``errors`` holds at least one rank."""
    return min(errors, key=lambda rank: (caused_by_peer(errors[rank]), rank))


class WorkerDiedError(ScCoreError, RuntimeError):
    """Worker processes are gone. ``ranks`` lists them; ``method`` is the call that found
    out (``None`` when the liveness check did)."""

    def __init__(self, method: str | None, ranks: Sequence[int], reason: str = "") -> None:
        self.method = method
        self.ranks = tuple(sorted(ranks))
        self.reason = reason
        where = f"{method}: " if method else ""
        text = f"{where}worker {_ranks_text(self.ranks)} died"
        if reason:
            text += f" ({reason})"
        super().__init__(text)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.method, self.ranks, self.reason))


class CallTimeoutError(ScCoreError, TimeoutError):
    """A call passed its deadline. ``pending_ranks`` had not answered after ``timeout``
    seconds. The workers keep running: the backend cannot interrupt a method."""

    def __init__(self, method: str, pending_ranks: Sequence[int], timeout: float | None) -> None:
        self.method = method
        self.pending_ranks = tuple(pending_ranks)
        self.timeout = timeout
        super().__init__(
            f"{method}: no answer from {_ranks_text(self.pending_ranks)} within the "
            f"{timeout}s timeout"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.method, self.pending_ranks, self.timeout))


class RendezvousError(ScCoreError, RuntimeError):
    """Rank 0 could not publish its MASTER_ADDR/MASTER_PORT, or published twice."""


class RendezvousTimeoutError(ScCoreError, TimeoutError):
    """A rank waited longer than its timeout for rank 0 to publish MASTER_ADDR/MASTER_PORT."""


class WorkerGroupError(ScCoreError, RuntimeError):
    """A worker group used in a state in which it cannot serve the request."""


class WorkerGroupClosedError(WorkerGroupError):
    """A call on a worker group (or a group spawned from it) after :meth:`close`."""


class BackendNotImplementedError(ScCoreError, NotImplementedError):
    """A worker group that binds methods (verl's ``_bind_worker_method`` with a
    ``func_generator``) but does not implement the backend hook a call needs."""


class UnknownMethodError(ScCoreError, AttributeError):
    """An attribute of a worker group that is neither its own nor a bound worker method."""


class InvalidConfigError(ScCoreError, ValueError):
    """A bad value given to an sc-core constructor or option."""


class ConfigTypeError(ScCoreError, TypeError):
    """An argument of the wrong type given to an sc-core constructor or option."""


class ResourcePoolError(InvalidConfigError):
    """A resource pool specification that cannot place any worker."""


class InvalidCallOptionsError(InvalidConfigError):
    """A bad ``timeout`` value given to ``.options()`` or a group."""


class UnsupportedCallError(ScCoreError, TypeError):
    """A call its dispatch mode cannot make: ``proxy.stream(...)`` of a mode without a work
    plan (``ONE_TO_ALL``, ``RANK_ZERO``...), or a non-blocking call of a mode that schedules
    its units from the driver (``DP_COMPUTE_PROTO_BALANCED``, balanced and sticky modes)."""


class MethodCollisionError(ScCoreError, TypeError):
    """A worker class whose method would replace an attribute the framework relies on: an
    attribute of the worker group, or a reserved ``Worker`` name."""


class ColocationError(InvalidConfigError):
    """A colocation request that cannot be built: bad role names, clashing method names."""


class UnknownRoleError(ScCoreError, _KeyErrorMessage):
    """A role that the colocated or fused worker class does not have, or that a
    ``ResourcePoolManager`` maps to no pool."""


class WorkerEnvironmentError(ScCoreError, ValueError):
    """A worker environment (WORLD_SIZE, RANK, ...) that cannot be used."""


class MissingEnvironmentError(ScCoreError, _KeyErrorMessage):
    """A required variable (WORLD_SIZE, RANK) missing from a worker's environment."""


class VisibleDevicesError(WorkerEnvironmentError):
    """``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and ``ROCR_VISIBLE_DEVICES`` that
    contradict each other."""


class MeshRegistrationError(ScCoreError, ValueError):
    """A device mesh registered twice on one worker, or with a bad dp rank."""


class UnknownMeshError(ScCoreError, _KeyErrorMessage):
    """A device mesh queried on a worker that never registered it."""
