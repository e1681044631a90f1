"""Futures of non-blocking calls: per-rank :class:`RayFuture`, joined lazily.

A non-blocking call runs each rank's method through ``_sc_call_with_meta`` with two return
values: a tiny metadata reference (the row count of a DataProto result) and the value
reference. Nothing is fetched when the call returns. The collect function of a splitting
mode joins the per-rank futures with :class:`RayFuture`'s shard adapter into one
``sc_protocol.DataProtoFuture`` (:class:`RayDataProtoFuture`, built in
:mod:`sc_ray._proto_futures`, which imports sc-protocol only then); the adapters live in
:mod:`sc_ray._adapters`.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence, Sized
from dataclasses import dataclass
from typing import Any

from sc_core import CallTimeoutError, WorkerDiedError, WorkerError

from . import _ray_api as rapi
from ._shared import private_copy
from ._wire import is_data_proto

__all__ = ["Deadline", "RayFuture", "await_with_deadline", "resolve_refs", "row_meta"]


@dataclass(frozen=True)
class Deadline:
    """A non-blocking call's deadline, as a wall-clock instant (``time.time()``), so that it
    means the same in the driver and in the worker that consumes the future."""

    at: float
    timeout: float
    method: str
    ranks: tuple[int, ...]

    def remaining(self) -> float:
        return max(0.0, self.at - time.time())

    def error(self, ranks: Sequence[int] | None = None) -> CallTimeoutError:
        return CallTimeoutError(self.method, list(ranks or self.ranks), self.timeout)


def _get(
    refs: list[Any], deadline: Deadline | None, ranks: Sequence[int] | None = None
) -> list[Any]:
    """``rapi.get`` within ``deadline`` (a ``CallTimeoutError`` once it has passed)."""
    if deadline is None:
        return rapi.get(refs)
    try:
        return rapi.get(refs, timeout_s=deadline.remaining())
    except Exception as exc:
        if rapi.is_get_timeout(exc):
            raise deadline.error(ranks) from None
        raise


def row_meta(value: object) -> int | None:
    """The metadata a worker returns with a non-blocking result: a DataProto's row count."""
    if is_data_proto(value) and isinstance(value, Sized):
        return len(value)
    return None


def raise_remote_failure(exc: BaseException, method: str, rank: int) -> None:
    """Re-raise a Ray failure of ``method`` on ``rank`` as sc-core's error."""
    failure = rapi.classify_failure(exc)
    if failure.kind == "died":
        raise WorkerDiedError(method, [rank], failure.cause_type) from exc
    if isinstance(failure.cause, WorkerError):  # raised by the worker's _sc_call
        raise failure.cause
    if failure.kind == "raised":
        raise WorkerError(
            method,
            rank,
            failure.cause_type,
            str(failure.cause),
            failure.traceback,
            cause=failure.cause,
        ) from exc
    raise exc


def resolve_refs(refs: list[Any], deadline: Deadline | None = None) -> list[Any]:
    """A DataProtoFuture resolver: the values of Ray references, fetched where it runs (in
    a consumer worker, each reference is read from the local object store when it can);
    with ``deadline``, a ``CallTimeoutError`` once it has passed. The future copies what it
    keeps of them (sc-protocol's ``DataProtoFuture.get``: once, after slicing and joining)."""
    return _get(refs, deadline)


def resolver(deadline: Deadline | None) -> Any:
    """:func:`resolve_refs` bound to ``deadline`` (picklable: it travels with the future)."""
    return resolve_refs if deadline is None else functools.partial(resolve_refs, deadline=deadline)


def await_with_deadline(refs: list[Any], deadline: Deadline, rank: int) -> Any:
    """Run as a Ray task for a non-blocking call with a deadline whose references the
    caller fetches with ``ray.get``: returns the value of ``refs[0]`` (the reference is
    wrapped in a list so that Ray hands it over unresolved), or raises ``CallTimeoutError``
    at the deadline, which ``ray.get`` on this task's reference then raises."""
    ready, _ = rapi.wait(refs, 1, deadline.remaining())
    if not ready:
        raise deadline.error([rank])
    return rapi.get(refs)[0]


class RayFuture:
    """One rank's result of a non-blocking call; :meth:`get` fetches it.

    ``value_ref`` is the Ray reference of the value, ``meta_ref`` that of its row count
    (``None`` when unknown). A worker method receiving a RayFuture gets its value
    (``@register(materialize_futures=True)``, the default).
    """

    __slots__ = ("deadline", "meta_ref", "method", "rank", "value_ref")

    def __init__(
        self,
        value_ref: rapi.ObjectRef,
        meta_ref: rapi.ObjectRef | None,
        method: str,
        rank: int,
        deadline: Deadline | None = None,
    ) -> None:
        self.value_ref = value_ref
        self.meta_ref = meta_ref
        self.method = method
        self.rank = rank
        self.deadline = deadline

    def get(self) -> Any:
        """The value (waits for it, within the call's deadline if it had one); a worker
        failure raises sc-core's error, a passed deadline ``CallTimeoutError``."""
        try:
            return private_copy(_get([self.value_ref], self.deadline, [self.rank])[0])
        except CallTimeoutError:
            raise
        except Exception as exc:
            raise_remote_failure(exc, self.method, self.rank)
            raise  # pragma: no cover - raise_remote_failure always raises

    def rows(self) -> int | None:
        """The row count of a DataProto result (fetches only the tiny metadata)."""
        if self.meta_ref is None:
            return None
        try:
            value = _get([self.meta_ref], self.deadline, [self.rank])[0]
        except CallTimeoutError:
            raise
        except Exception as exc:
            raise_remote_failure(exc, self.method, self.rank)
            raise  # pragma: no cover
        return value if isinstance(value, int) else None

    def done(self) -> bool:
        """Whether the value is ready (without fetching it)."""
        ready, _ = rapi.wait([self.value_ref], 1, 0)
        return bool(ready)

    def __reduce__(self) -> tuple[Any, ...]:
        return (RayFuture, (self.value_ref, self.meta_ref, self.method, self.rank, self.deadline))

    def __repr__(self) -> str:
        return f"<RayFuture {self.method} rank {self.rank}>"
