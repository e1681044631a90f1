"""The event loop a reward scorer owns: one loop, running forever on a daemon thread of its
own, for all of the scorer's batches.

One loop for the scorer's life (not ``asyncio.run`` per batch) so that what an ``async``
reward function keeps between calls (an HTTP client, a connection pool) stays bound to a
live loop, and so that :meth:`~sc_trainer.rewards.RewardScorer.score` also works from a
thread that is running an event loop of its own. Its semaphore bounds the calls in flight.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

__all__ = ["LoopThread"]

_T = TypeVar("_T")

# How long the loop, once stopped, gives its unfinished tasks to end after cancelling them.
_CANCEL_GRACE_S = 1.0

_loop_numbers = itertools.count()


class LoopThread:
    """An event loop on a daemon thread, and a semaphore of ``limit`` slots for it."""

    def __init__(self, limit: int, name: str = "sc-reward-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.semaphore = asyncio.Semaphore(limit)
        self._thread = threading.Thread(
            target=self._run, name=f"{name}-{next(_loop_numbers)}", daemon=True
        )
        self._thread.start()

    def submit(self, coroutine: Coroutine[Any, Any, _T]) -> concurrent.futures.Future[_T]:
        """Run ``coroutine`` on the loop; its outcome is set on the future returned."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop)

    def stop(self, timeout: float) -> bool:
        """Stop the loop (its tasks are cancelled, and given a moment to end) and wait up to
        ``timeout`` seconds for its thread. ``False`` if the thread is still running then: a
        call blocks the loop, and the thread stays behind (a daemon thread)."""
        self.request_stop()
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def request_stop(self) -> None:
        """Ask the loop to stop (as :meth:`stop` does) without waiting; from any thread,
        the loop's own included."""
        with contextlib.suppress(RuntimeError):  # closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            try:
                tasks = asyncio.all_tasks(self.loop)
                for task in tasks:
                    task.cancel()
                if tasks:
                    self.loop.run_until_complete(asyncio.wait(tasks, timeout=_CANCEL_GRACE_S))
                self.loop.run_until_complete(self.loop.shutdown_asyncgens())
            finally:
                self.loop.close()
