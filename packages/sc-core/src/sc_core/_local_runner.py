"""The rank threads of the in-process backend: each rank's calls run in order on a daemon
thread of its own (or inline on the caller's), with an asyncio event loop for ``async def``
methods; :class:`LocalHandle` is one rank's running call, as ``LocalBackend`` hands it out.

At interpreter exit the rank threads still running are stopped and joined (at most
``EXIT_JOIN_S`` in all) while the interpreter is whole: a daemon thread that is still running
or ending when the interpreter finalizes is torn out of whatever C++ code it is in (torch's),
and the process aborts ("terminate called without an active exception") after a script
that never closed its groups has done its work.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import inspect
import queue
import threading
import time
import traceback
import weakref
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ._errors import CallTimeoutError, WorkerDiedError, WorkerError

__all__ = ["LocalHandle", "Outcome", "RankRunner", "Turns", "worker_traceback"]

#: how long interpreter exit waits, in all, for the rank threads to end
EXIT_JOIN_S = 5.0


@dataclass
class Outcome:
    value: Any = None
    error: BaseException | None = None
    traceback: str = ""
    start: float = 0.0
    end: float = 0.0
    died: bool = False


async def _await(awaitable: Any) -> Any:
    return await awaitable


class RankRunner:
    """A daemon thread running one rank's tasks in submission order."""

    def __init__(self, name: str, inline: bool) -> None:
        self._inline = inline
        self._queue: queue.SimpleQueue[
            tuple[concurrent.futures.Future[Outcome], Callable[[], Outcome]] | None
        ] = queue.SimpleQueue()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        if not inline:
            self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
            self._thread.start()
            _LIVE.add(self)

    def submit(self, task: Callable[[], Outcome]) -> concurrent.futures.Future[Outcome]:
        fut: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
        if self._inline:
            fut.set_running_or_notify_cancel()
            fut.set_result(task())
        else:
            self._queue.put((fut, task))
        return fut

    def run_awaitable(self, awaitable: Any) -> Any:
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        coro: Coroutine[Any, Any, Any] = (
            awaitable if inspect.iscoroutine(awaitable) else _await(awaitable)
        )
        return self._loop.run_until_complete(coro)

    def _serve(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                break
            fut, task = item
            if fut.set_running_or_notify_cancel():
                fut.set_result(task())
            # Drop the references before blocking on the next item: the task (a bound method
            # of the group) would otherwise keep the group alive and its finalizer from running.
            del item, fut, task
        if self._loop is not None:
            self._loop.close()

    def close(self) -> None:
        if self._thread is not None:
            self._queue.put(None)

    def join(self, timeout: float) -> None:
        """Wait at most ``timeout`` seconds for the thread to end (after :meth:`close`)."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


#: the runners whose thread was started (a runner lives while its thread runs: the thread's
#: target is its bound method)
_LIVE: weakref.WeakSet[RankRunner] = weakref.WeakSet()


def _join_at_exit() -> None:
    """Stop every rank thread and wait for them to end, ``EXIT_JOIN_S`` in all (a thread
    inside a call that does not return in time is left, as before)."""
    runners = list(_LIVE)
    for runner in runners:
        runner.close()
    deadline = time.monotonic() + EXIT_JOIN_S
    for runner in runners:
        runner.join(max(0.0, deadline - time.monotonic()))


atexit.register(_join_at_exit)


class Turns:
    """The last task submitted by a group (and the groups spawned from it): the next one
    starts after it, so that ranks take turns."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.last: concurrent.futures.Future[Outcome] | None = None


class LocalHandle:
    """The backend handle of one rank's call: ``result(timeout)`` waits for its value."""

    def __init__(self, rank: int, method_name: str, future: concurrent.futures.Future[Outcome]):
        self.rank = rank
        self.method_name = method_name
        self.future = future

    def done(self) -> bool:
        return self.future.done()

    def result(self, timeout: float | None = None) -> Any:
        """The value, or :class:`~sc_core.WorkerError` / :class:`~sc_core.WorkerDiedError` /
        :class:`~sc_core.CallTimeoutError`."""
        try:
            outcome = self.future.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            raise CallTimeoutError(self.method_name, [self.rank], timeout) from None
        if outcome.died:
            raise WorkerDiedError(self.method_name, [self.rank], "killed with kill_worker")
        if outcome.error is not None:
            raise WorkerError.from_exception(
                self.method_name, self.rank, outcome.error, remote_traceback=outcome.traceback
            )
        return outcome.value

    def __repr__(self) -> str:
        state = "done" if self.done() else "running"
        return f"<LocalHandle {self.method_name} rank {self.rank} {state}>"


def worker_traceback(exc: BaseException) -> str:
    """The traceback text of ``exc`` without this module's own frames at its top."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FILES:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))


#: this backend's own source files, whose frames a worker's traceback leaves out
_OWN_FILES = {__file__, __file__.replace("_local_runner.py", "_local.py")}
