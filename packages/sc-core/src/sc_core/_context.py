"""A worker's environment, and the rendezvous through which rank 0 publishes its address.

A :class:`~sc_core.Worker` reads WORLD_SIZE, RANK, MASTER_ADDR, ... from *its* environment.
On Ray that is the actor process's ``os.environ``. The in-process backend runs every rank in
one process, so it gives each worker its own mapping through :func:`worker_context`, a
context variable consulted when the worker is constructed (``os.environ`` is never written).

The rendezvous: before a worker's ``__init__`` runs, rank 0 picks MASTER_ADDR/MASTER_PORT
(unless its environment already has them) and publishes them through a :class:`Rendezvous`;
every other rank whose environment lacks them waits for them. A backend hands its
rendezvous to the workers either through :func:`worker_context` (in-process) or by setting
``SC_RENDEZVOUS=package.module:factory`` in the worker's environment; the factory is called
with the environment and returns a :class:`Rendezvous` (or ``None`` for none).
"""

from __future__ import annotations

import abc
import contextlib
import importlib
import os
import threading
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from contextvars import ContextVar
from dataclasses import dataclass

from ._errors import RendezvousError, RendezvousTimeoutError, WorkerEnvironmentError
from ._settings import RENDEZVOUS

__all__ = [
    "InProcessRendezvous",
    "Rendezvous",
    "WorkerContext",
    "current_worker_context",
    "rendezvous_from_env",
    "worker_context",
    "worker_environ",
]

#: Keys a rendezvous carries from rank 0 to the other ranks.
MASTER_KEYS = ("MASTER_ADDR", "MASTER_PORT")


class Rendezvous(abc.ABC):
    """How rank 0 hands MASTER_ADDR/MASTER_PORT to the other ranks of one worker group.

    A backend implements both methods; ``publish`` is called once, by rank 0, and ``wait``
    by every other rank that does not already know the address. ``wait`` returns the
    published mapping (at least ``MASTER_ADDR`` and ``MASTER_PORT``) or raises
    :class:`~sc_core.backend.RendezvousTimeoutError` after ``timeout`` seconds (``None``: no limit).
    """

    @abc.abstractmethod
    def publish(self, info: Mapping[str, str]) -> None:
        """Rank 0: make ``info`` available to the other ranks."""

    @abc.abstractmethod
    def wait(self, timeout: float | None) -> dict[str, str]:
        """Another rank: block until rank 0 has published, and return what it published."""


class InProcessRendezvous(Rendezvous):
    """A rendezvous between threads of one process (the in-process backend's)."""

    def __init__(self) -> None:
        self._info: dict[str, str] | None = None
        self._event = threading.Event()
        self._lock = threading.Lock()

    def publish(self, info: Mapping[str, str]) -> None:
        with self._lock:
            if self._info is not None:
                raise RendezvousError(
                    f"InProcessRendezvous.publish: rank 0 already published {self._info}, "
                    f"got a second publish {dict(info)}"
                )
            self._info = dict(info)
        self._event.set()

    def wait(self, timeout: float | None) -> dict[str, str]:
        if not self._event.wait(timeout):
            raise RendezvousTimeoutError(
                f"InProcessRendezvous.wait: rank 0 did not publish MASTER_ADDR/MASTER_PORT "
                f"within {timeout}s"
            )
        if self._info is None:  # pragma: no cover - set before the event
            raise RendezvousError("InProcessRendezvous.wait: event set without info")
        return dict(self._info)


@dataclass(frozen=True)
class WorkerContext:
    """What a worker sees while it is constructed and while its methods run.

    ``env`` is the worker's environment (read and written by :class:`~sc_core.Worker`
    instead of ``os.environ``); ``rendezvous`` is the group's rendezvous, or ``None`` to
    fall back to ``SC_RENDEZVOUS`` in ``env``.
    """

    env: MutableMapping[str, str]
    rendezvous: Rendezvous | None = None


_current: ContextVar[WorkerContext | None] = ContextVar("sc_core_worker_context", default=None)
# Set while a colocated worker builds its role instances: they share the outer worker's
# rendezvous, which has already happened.
_skip_rendezvous: ContextVar[bool] = ContextVar("sc_core_skip_rendezvous", default=False)


@contextlib.contextmanager
def worker_context(
    env: MutableMapping[str, str], rendezvous: Rendezvous | None = None
) -> Iterator[WorkerContext]:
    """Within this block, workers constructed (and :func:`worker_environ`) use ``env``."""
    ctx = WorkerContext(env, rendezvous)
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


def current_worker_context() -> WorkerContext | None:
    """The innermost active :func:`worker_context`, or ``None`` outside any."""
    return _current.get()


def worker_environ() -> MutableMapping[str, str]:
    """The environment of the worker running now: its own mapping in the in-process
    backend, ``os.environ`` anywhere else. Worker code that must run in both reads its
    environment through this (or ``Worker.env``) rather than ``os.environ``."""
    ctx = _current.get()
    return ctx.env if ctx is not None else os.environ


def rendezvous_from_env(env: Mapping[str, str]) -> Rendezvous | None:
    """The rendezvous named by ``SC_RENDEZVOUS=module:factory`` in ``env``, or ``None``.

    The factory is called with ``env`` and may itself return ``None``.
    """
    spec = RENDEZVOUS.get(env)
    if not spec:
        return None
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise WorkerEnvironmentError(
            f"SC_RENDEZVOUS must be 'package.module:factory', got {spec!r}"
        )
    try:
        factory: Callable[[Mapping[str, str]], Rendezvous | None] = getattr(
            importlib.import_module(module_name), attr
        )
    except (ImportError, AttributeError) as exc:
        raise WorkerEnvironmentError(
            f"SC_RENDEZVOUS={spec!r} cannot be loaded: {type(exc).__name__}: {exc}"
        ) from exc
    result = factory(env)
    if result is not None and not isinstance(result, Rendezvous):
        raise WorkerEnvironmentError(
            f"SC_RENDEZVOUS={spec!r} returned {type(result).__qualname__}, not a Rendezvous"
        )
    return result
