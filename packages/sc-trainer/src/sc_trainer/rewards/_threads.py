"""The threads that run a synchronous reward function: a small pool of daemon threads whose
hung calls can be written off.

A Python thread cannot be stopped from outside. When a call runs past its deadline the
scorer stops waiting for it and :meth:`RewardThreads.write_off` gives its thread up: the
pool no longer counts it and starts a fresh thread for the next call, so a hung call never
starves the pool. The written-off thread stays blocked in the user's function (a leak,
counted by :attr:`RewardThreads.leaked`); if the call ever returns, its thread exits.

The threads are daemon threads, on purpose: :class:`concurrent.futures.ThreadPoolExecutor`
joins its threads when the interpreter exits, so one reward call that never returns would
keep the process from exiting.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future

__all__ = ["RewardThreads", "WorkItem"]

_thread_numbers = itertools.count()


class WorkItem:
    """One call handed to the pool, and its :class:`~concurrent.futures.Future`."""

    __slots__ = ("call", "finished", "future", "written_off")

    def __init__(self, call: Callable[[], object]) -> None:
        self.call = call
        self.future: Future[object] = Future()
        self.finished = False
        self.written_off = False


class RewardThreads:
    """At most ``size`` threads (started as calls come) that run the calls submitted, in
    order, plus the threads written off and still blocked."""

    def __init__(self, size: int, name: str = "sc-reward") -> None:
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[WorkItem | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._workers = 0
        self._leaked = 0
        self._closed = False

    @property
    def leaked(self) -> int:
        """Threads written off whose call has not returned yet."""
        with self._lock:
            return self._leaked

    def submit(self, call: Callable[[], object]) -> WorkItem:
        """Run ``call()`` on a thread of the pool; its outcome is set on the item's future.

        Raises ``RuntimeError`` after :meth:`close` (the scorer never lets that happen)."""
        item = WorkItem(call)
        with self._lock:
            if self._closed:
                raise RuntimeError("RewardThreads.submit after close")
            self._queue.put(item)
            if self._workers < self._size:
                self._workers += 1
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{next(_thread_numbers)}", daemon=True
                )
                thread.start()
        return item

    def write_off(self, item: WorkItem) -> bool:
        """Give up the thread running ``item`` (its deadline passed): the pool starts another
        in its place. ``False`` if the call had already finished, or had not started (then it
        is cancelled and never starts)."""
        if item.future.cancel():
            return False
        with self._lock:
            if item.finished or item.written_off:
                return False
            item.written_off = True
            self._workers -= 1
            self._leaked += 1
            return True

    def close(self) -> None:
        """Let the threads exit once they are idle (without waiting for them): calls already
        queued still run. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for _ in range(self._workers):
                self._queue.put(None)

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            if not item.future.set_running_or_notify_cancel():
                continue
            value: object = None
            try:
                value = item.call()
            except BaseException as error:  # the user's, whatever it is, goes to the caller
                failed: BaseException | None = error
            else:
                failed = None
            with self._lock:
                item.finished = True
                written_off = item.written_off
                if written_off:
                    self._leaked -= 1
            if failed is None:
                item.future.set_result(value)
            else:
                item.future.set_exception(failed)
            del item, failed, value
            if written_off:
                return
