"""The rank threads of the in-process backend: each rank's calls run in order on a daemon
thread of its own (or inline on the caller's), with an asyncio event loop for ``async def``
methods; :class:`LocalHandle` is one rank's running call, as ``LocalBackend`` hands it out."""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
import traceback
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from ._errors import CallTimeoutError, WorkerDiedError, WorkerError

__all__ = ["LocalHandle", "Outcome", "RankRunner", "Turns", "worker_traceback"]


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
