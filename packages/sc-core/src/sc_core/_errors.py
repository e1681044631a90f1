"""The exceptions sc-core raises, and that every backend (sc-ray included) raises too.

Every error is raised explicitly (never through ``assert``) and subclasses the builtin
exception it means, so callers may catch either::

    ScCoreError (Exception)                    base class of everything below
    ├── WorkerError (RuntimeError)             a worker method raised: names the method, the
    │                                          first failing rank, the original exception
    │                                          type and the remote traceback; lists the other
    │                                          failing ranks
    ├── WorkerDiedError (RuntimeError)         a worker process is gone: names the ranks and
    │                                          the method that found out
    ├── CallTimeoutError (TimeoutError)        a call passed its deadline: names the method,
    │                                          the ranks that had not answered, the timeout
    ├── RendezvousError (RuntimeError)         rank 0 could not publish MASTER_ADDR/PORT, or
    │   │                                      published twice
    │   └── RendezvousTimeoutError (TimeoutError)  a rank waited too long for rank 0
    ├── WorkerGroupError (RuntimeError)        a group used in a state it cannot serve
    │                                          (closed, no workers, unknown backend handle)
    ├── UnknownMethodError (AttributeError)    a worker-group attribute that is no bound method
    ├── InvalidConfigError (ValueError)        a bad argument to an sc-core constructor or
    │   │                                      option; also a TypeError for wrong types
    │   ├── ResourcePoolError                  an empty pool, zero/negative process counts
    │   ├── InvalidCallOptionsError            ``.options(timeout=-1)``, ``blocking="yes"``
    │   ├── MethodCollisionError               a registered method whose name is taken on
    │   │                                      the worker group (or twice in a colocation)
    │   └── ColocationError                    a bad class_dict, an unknown spawn role
    ├── WorkerEnvironmentError (ValueError)    a worker environment that cannot be used:
    │   │                                      RANK >= WORLD_SIZE, RANK="x", ...
    │   ├── MissingEnvironmentError (KeyError) WORLD_SIZE or RANK not set
    │   └── VisibleDevicesError                CUDA/HIP/ROCR_VISIBLE_DEVICES that disagree
    ├── MeshRegistrationError (ValueError)     a mesh registered twice on one worker
    └── UnknownMeshError (KeyError)            a mesh queried that was never registered

Messages name the method, the rank and the offending value.
"""

from __future__ import annotations

import traceback
from collections.abc import Sequence
from typing import Any

__all__ = [
    "CallTimeoutError",
    "ColocationError",
    "InvalidCallOptionsError",
    "InvalidConfigError",
    "MeshRegistrationError",
    "MethodCollisionError",
    "MissingEnvironmentError",
    "RendezvousError",
    "RendezvousTimeoutError",
    "ResourcePoolError",
    "ScCoreError",
    "UnknownMeshError",
    "UnknownMethodError",
    "VisibleDevicesError",
    "WorkerDiedError",
    "WorkerEnvironmentError",
    "WorkerError",
    "WorkerGroupError",
]


class ScCoreError(Exception):
    """Base class of every error raised by sc-core and by the backends built on it."""


class _KeyErrorMessage(KeyError):
    """A KeyError whose ``str()`` is its message, not the message's ``repr``."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


def _ranks_text(ranks: Sequence[int]) -> str:
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"


class WorkerError(ScCoreError, RuntimeError):
    """A worker method raised an exception.

    Attributes: ``method`` (the method name), ``rank`` (the lowest failing rank, whose error
    is reported), ``error_type`` (the original exception's class name), ``error_message``,
    ``remote_traceback`` (the traceback text as formatted where the error happened),
    ``other_failed_ranks`` and ``cause`` (the original exception object when the backend
    could recover it, else ``None``; it is also chained as ``__cause__``).
    """

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
        super().__init__(text)
        if cause is not None:
            self.__cause__ = cause

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

    def __reduce__(self) -> tuple[Any, ...]:
        return (
            _rebuild_worker_error,
            (
                type(self),
                self.method,
                self.rank,
                self.error_type,
                self.error_message,
                self.remote_traceback,
                self.other_failed_ranks,
            ),
        )


def _rebuild_worker_error(
    cls: type[WorkerError],
    method: str,
    rank: int,
    error_type: str,
    error_message: str,
    remote_traceback: str,
    other_failed_ranks: Sequence[int],
) -> WorkerError:
    return cls(
        method,
        rank,
        error_type,
        error_message,
        remote_traceback,
        other_failed_ranks=other_failed_ranks,
    )


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


class RendezvousTimeoutError(RendezvousError, TimeoutError):
    """A rank waited longer than its timeout for rank 0 to publish MASTER_ADDR/MASTER_PORT."""


class WorkerGroupError(ScCoreError, RuntimeError):
    """A worker group used in a state in which it cannot serve the request."""


class UnknownMethodError(ScCoreError, AttributeError):
    """An attribute of a worker group that is neither its own nor a bound worker method."""


class InvalidConfigError(ScCoreError, ValueError, TypeError):
    """A bad argument to an sc-core constructor or option (a value or a type)."""


class ResourcePoolError(InvalidConfigError):
    """A resource pool specification that cannot place any worker."""


class InvalidCallOptionsError(InvalidConfigError):
    """A bad ``timeout`` or ``blocking`` given to ``.options()``."""


class MethodCollisionError(InvalidConfigError):
    """A registered worker method whose name is already taken on the worker group."""


class ColocationError(InvalidConfigError):
    """A colocation request that cannot be built: bad roles, clashing method names."""


class WorkerEnvironmentError(ScCoreError, ValueError):
    """A worker environment (WORLD_SIZE, RANK, ...) that cannot be used."""


class MissingEnvironmentError(WorkerEnvironmentError, _KeyErrorMessage):
    """A required variable (WORLD_SIZE, RANK) missing from a worker's environment."""


class VisibleDevicesError(WorkerEnvironmentError):
    """``CUDA_VISIBLE_DEVICES``, ``HIP_VISIBLE_DEVICES`` and ``ROCR_VISIBLE_DEVICES`` that
    contradict each other."""


class MeshRegistrationError(ScCoreError, ValueError):
    """A device mesh registered twice on one worker, or with a bad dp rank."""


class UnknownMeshError(ScCoreError, _KeyErrorMessage):
    """A device mesh queried on a worker that never registered it."""
