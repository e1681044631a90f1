"""Tasks, objects in the store, and Ray failures sorted for sc-core errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from ._base import ObjectRef, _exc, logger, ray

# --- tasks and objects -------------------------------------------------------------------


def run_task(
    fn: Callable[..., Any], options: Mapping[str, Any], args: Sequence[Any] = ()
) -> ObjectRef:
    """Run ``fn`` as a Ray task with ``options``; returns the reference to its result."""
    remote_fn = ray.remote(fn)
    return cast("ObjectRef", remote_fn.options(**dict(options)).remote(*args))


def is_object_ref(obj: object) -> bool:
    """Whether ``obj`` is a Ray object reference."""
    return isinstance(obj, ray.ObjectRef)


def put(value: object) -> ObjectRef:
    """Store ``value`` in the object store once and return its reference."""
    return cast("ObjectRef", ray.put(value))


def is_get_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray's ``GetTimeoutError`` (a ``get`` that ran out of time)."""
    return isinstance(exc, _exc.GetTimeoutError)


def get(refs: Sequence[ObjectRef], timeout_s: float | None = None) -> list[Any]:
    """The values of ``refs``, in order. Raises Ray's exceptions (see :func:`classify_failure`)."""
    return list(ray.get(list(refs), timeout=timeout_s))


def wait(
    refs: Sequence[ObjectRef], num_returns: int, timeout_s: float | None
) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """``ray.wait`` without fetching: ``(ready, not_ready)`` after at most ``timeout_s``."""
    if not refs:
        return [], []
    ready, not_ready = ray.wait(
        list(refs), num_returns=num_returns, timeout=timeout_s, fetch_local=False
    )
    return list(ready), list(not_ready)


def is_ready(ref: ObjectRef) -> bool:
    """Whether the value behind ``ref`` exists (or its task failed), without fetching it."""
    ready, _ = wait([ref], 1, 0)
    return bool(ready)


def cancel(ref: ObjectRef) -> bool:
    """Ask Ray to cancel the task behind ``ref``: a queued task is dropped, a running method
    of an asyncio actor gets ``CancelledError``; a running method of any other actor goes on.
    Returns whether Ray accepted the request."""
    try:
        ray.cancel(ref, force=False)
    except Exception as exc:  # already finished, or not cancellable
        logger.debug("ray.cancel(%s) refused: %s", ref, exc)
        return False
    return True


def register_serializer(
    cls: type, serializer: Callable[[Any], Any], deserializer: Callable[[Any], Any]
) -> None:
    """``ray.util.register_serializer`` (for this process's serialization context)."""
    ray.util.register_serializer(cls, serializer=serializer, deserializer=deserializer)


# --- failures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFailure:
    """A Ray exception, sorted: ``kind`` is ``"died"`` (the actor is gone), ``"raised"``
    (the method raised ``cause``), or ``"other"``."""

    kind: str
    cause: BaseException
    cause_type: str
    traceback: str


def classify_failure(exc: BaseException) -> RemoteFailure:
    """Sort an exception raised by :func:`get` on one reference."""
    if isinstance(exc, _exc.RayActorError) and getattr(exc, "actor_init_failed", False):
        # The constructor raised: report it like a method that raised.
        inner = next((a for a in exc.args if isinstance(a, _exc.RayTaskError)), None)
        if inner is not None:
            return classify_failure(inner)
        return RemoteFailure("raised", exc, "ActorInitError", str(exc))
    if isinstance(
        exc,
        (
            _exc.RayActorError,
            _exc.ActorUnavailableError,
            _exc.WorkerCrashedError,
            _exc.NodeDiedError,
        ),
    ):
        return RemoteFailure("died", exc, type(exc).__name__, str(exc))
    if isinstance(exc, _exc.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        tb = str(getattr(exc, "traceback_str", "") or str(exc))
        return RemoteFailure("raised", cause, type(cause).__name__, tb)
    return RemoteFailure("other", exc, type(exc).__name__, str(exc))
