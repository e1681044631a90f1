"""Scoring a batch: every row's call in parallel, each under its own deadline, and no failure
ever recorded as a silent zero.

Concurrency: the scorer owns one event loop on a thread of its own (:mod:`._loop`); a batch
is one coroutine there that starts a task per row, at most ``max_workers`` of them calling
at once (a semaphore). An ``async def`` function is called and awaited on that loop; a
plain function runs on one of ``max_workers`` daemon threads (:mod:`._threads`) that the
task awaits; if a plain function returns an awaitable, that is awaited on the loop too,
under what is left of the same deadline. A row's deadline starts when its call starts
(when it gets a slot), so a batch larger than ``max_workers`` does not eat into it.

A call past its deadline fails the row. An awaitable is cancelled, and the scorer does not
wait for the cancellation to take (``asyncio.wait`` with a timeout, then ``cancel``, rather
than ``asyncio.wait_for``, which waits for a coroutine that ignores its cancellation and
cannot tell its own timeout from a ``TimeoutError`` the function raised). A thread cannot
be stopped: the scorer stops waiting, writes the thread off and the pool starts another in
its place, so later calls and batches never queue behind a hung call; the hung thread is a
leak (:attr:`RewardScorer.leaked_threads`) that ends when its call returns, or with the
process (daemon threads never hold up its exit).

An ``async`` function that blocks the loop itself (``time.sleep``, blocking I/O) stops
every deadline from firing: :meth:`RewardScorer.score` waits for the batch at most
``timeout_s * (ceil(rows / max_workers) + 1) + 10`` seconds, then gives the loop up (the
next batch gets a new one) and fails the rows that had not finished as timed out.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import math
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal, TypeVar

from .._errors import (
    RewardFunctionError,
    RewardNotFoundError,
    TrainerConfigError,
    TrainerStateError,
)
from ._calling import accepts_extra_info, check_signature, describe, is_async_callable
from ._checks import CallResult, Failed, Raised, Returned, TimedOut, judge, short_repr
from ._loop import LoopThread
from ._threads import RewardThreads
from ._types import RewardInput, RewardOutcome

__all__ = ["RewardScorer"]

logger = logging.getLogger(__name__)

_S = TypeVar("_S", bound="RewardScorer")

# Added to the longest a batch can take when every call keeps its deadline, before the
# scorer decides that its event loop is blocked.
_WATCHDOG_GRACE_S = 10.0
# How long close() waits for the event loop's thread.
_CLOSE_WAIT_S = 5.0
# How many of the other failed rows a RewardFunctionError's message lists.
_LISTED_ROWS = 10


class RewardScorer:
    """Scores batches of rows (:class:`RewardInput`) with one reward function ``fn``, the
    calls in parallel, each within ``timeout_s`` seconds.

    ``fn`` is called as verl calls ``compute_score``, with keywords: ``fn(data_source=...,
    solution_str=..., ground_truth=..., extra_info=...)`` (``extra_info`` left out if ``fn``
    takes no such parameter nor ``**kwargs``); a signature that cannot take them raises
    :class:`RewardNotFoundError` here. It returns a number or a dict with a number under
    ``"score"`` (see :class:`RewardOutcome` for the other entries); it may be ``async def``,
    or return an awaitable. ``max_workers`` calls run at once at most: on as many threads
    for a plain function, as tasks on the scorer's event loop for an ``async`` one.

    A row whose call raises, runs past ``timeout_s``, returns something that is not a
    number (``None``, a string, a dict without a number under ``"score"``) or returns a
    number that is not finite has failed. ``on_error="raise"`` (the default): the batch
    raises :class:`RewardFunctionError` for the first failed row in input order, once every
    call of the batch has ended; ``on_error="count"``: failed rows score ``0.0`` and are
    counted and listed in the outcome, and a warning quotes the first. ``label`` names the
    function in messages (default: ``path:name`` for a function
    :func:`load_reward_function` loaded, its qualified name otherwise).

    Invalid settings raise :class:`~sc_trainer.TrainerConfigError`. :meth:`close` (or the
    ``with`` block) stops the event loop and the threads; scoring after that raises
    :class:`~sc_trainer.trainer.TrainerStateError`. A scorer garbage-collected without
    ``close`` stops them too, without waiting.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        timeout_s: float = 30.0,
        max_workers: int = 8,
        on_error: Literal["raise", "count"] = "raise",
        label: str | None = None,
    ) -> None:
        if not callable(fn):
            raise RewardNotFoundError(
                f"RewardScorer: the reward function {short_repr(fn)} is not callable"
            )
        if not (timeout_s > 0 and math.isfinite(timeout_s)):
            raise TrainerConfigError(
                f"RewardScorer: timeout_s must be a positive number of seconds, not {timeout_s!r}"
            )
        if max_workers < 1:
            raise TrainerConfigError(
                f"RewardScorer: max_workers must be 1 or more, not {max_workers!r}"
            )
        if on_error not in ("raise", "count"):
            raise TrainerConfigError(
                f'RewardScorer: on_error must be "raise" or "count", not {on_error!r}'
            )
        self._fn = fn
        self._label = label if label is not None else describe(fn)
        self._timeout_s = float(timeout_s)
        self._max_workers = max_workers
        self._on_error = on_error
        self._is_async = is_async_callable(fn)
        self._extra_info = accepts_extra_info(fn)
        check_signature(fn, self._label, self._extra_info)
        self._lock = threading.Lock()
        self._loop: LoopThread | None = None
        self._threads: RewardThreads | None = None
        self._closed = False

    @property
    def label(self) -> str:
        """The name of the function in messages."""
        return self._label

    @property
    def timeout_s(self) -> float:
        """The deadline of one call, in seconds from its start."""
        return self._timeout_s

    @property
    def max_workers(self) -> int:
        """How many calls run at once at most."""
        return self._max_workers

    @property
    def on_error(self) -> Literal["raise", "count"]:
        """What a failed row does: raise, or count and score 0.0."""
        return self._on_error

    @property
    def is_async(self) -> bool:
        """Whether the function is ``async`` (called on the event loop, not on threads)."""
        return self._is_async

    @property
    def leaked_threads(self) -> int:
        """Threads given up on calls past their deadline that are still blocked in them."""
        with self._lock:
            return self._threads.leaked if self._threads is not None else 0

    def score(self, inputs: Iterable[RewardInput]) -> RewardOutcome:
        """The scores of ``inputs``, in their order (see the class for failures)."""
        rows = list(inputs)
        results = self._run(rows)
        return self._collect(rows, results)

    def close(self) -> None:
        """Stop the event loop (cancelling what runs on it) and let the threads exit;
        idempotent. Threads blocked in calls past their deadline stay behind, as daemon
        threads."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            loop, threads = self._loop, self._threads
            self._loop = self._threads = None
        if loop is not None and not loop.stop(_CLOSE_WAIT_S):
            logger.warning(
                "reward function %s: the scorer's event loop did not stop within %g s "
                "(a call blocks it); its daemon thread is left behind",
                self._label,
                _CLOSE_WAIT_S,
            )
        if threads is not None:
            threads.close()
            if threads.leaked:
                logger.warning(
                    "reward function %s: %d thread(s) are still blocked in calls that ran "
                    "past their deadline; they are daemon threads and end with the process",
                    self._label,
                    threads.leaked,
                )

    def __enter__(self: _S) -> _S:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _run(self, rows: list[RewardInput]) -> list[CallResult]:
        with self._lock:
            if self._closed:
                raise TrainerStateError(f"RewardScorer ({self._label}) used after close()")
            if not rows:
                return []
            if self._loop is None:
                self._loop = LoopThread(self._max_workers)
                # a scorer dropped without close() does not keep its loop's thread running
                weakref.finalize(self, self._loop.request_stop)
            loop = self._loop
            threads: RewardThreads | None = None
            if not self._is_async:
                if self._threads is None:
                    self._threads = RewardThreads(self._max_workers)
                    weakref.finalize(self, self._threads.close)
                threads = self._threads
        slots: list[CallResult | None] = [None] * len(rows)
        bound = self._timeout_s * (math.ceil(len(rows) / self._max_workers) + 1)
        bound += _WATCHDOG_GRACE_S
        batch = loop.submit(self._batch(loop.semaphore, threads, rows, slots))
        try:
            batch.result(timeout=bound)
        except concurrent.futures.TimeoutError:
            self._give_up(loop, threads, bound)
        except concurrent.futures.CancelledError as error:
            raise TrainerStateError(
                f"RewardScorer ({self._label}) closed while a batch was being scored"
            ) from error
        finally:
            batch.cancel()
        stalled = TimedOut(self._timeout_s, f"the scorer's event loop stalled for {bound:g} s")
        return [stalled if slot is None else slot for slot in slots]

    def _give_up(self, loop: LoopThread, threads: RewardThreads | None, bound: float) -> None:
        """The batch ran past the watchdog's bound: its loop is blocked. The next batch gets
        a new loop and new threads."""
        logger.warning(
            "reward function %s: the batch did not end within %g s, so the scorer's event "
            "loop is blocked (an async reward function that calls time.sleep or blocking "
            "I/O?); giving that loop up, the next batch gets a new one",
            self._label,
            bound,
        )
        with self._lock:
            if self._loop is loop:
                self._loop = None
            if threads is not None and self._threads is threads:
                self._threads = None
        loop.request_stop()
        if threads is not None:
            threads.close()

    async def _batch(
        self,
        semaphore: asyncio.Semaphore,
        threads: RewardThreads | None,
        rows: list[RewardInput],
        slots: list[CallResult | None],
    ) -> None:
        await asyncio.gather(
            *(self._call(semaphore, threads, row, i, slots) for i, row in enumerate(rows))
        )

    async def _call(
        self,
        semaphore: asyncio.Semaphore,
        threads: RewardThreads | None,
        row: RewardInput,
        index: int,
        slots: list[CallResult | None],
    ) -> None:
        async with semaphore:
            deadline = asyncio.get_running_loop().time() + self._timeout_s
            call = functools.partial(self._fn, **self._keywords(row))
            if threads is None:
                try:
                    value = call()
                except asyncio.CancelledError:
                    raise
                except BaseException as error:  # the user's, whatever it is, fails the row
                    slots[index] = Raised(error)
                    return
            else:
                item = threads.submit(call)
                result = await self._until(asyncio.wrap_future(item.future), deadline)
                if isinstance(result, TimedOut):
                    threads.write_off(item)
                if not isinstance(result, Returned):
                    slots[index] = result
                    return
                value = result.value
            if inspect.isawaitable(value):
                slots[index] = await self._until(value, deadline)
            else:
                slots[index] = Returned(value)

    async def _until(self, awaitable: Awaitable[Any], deadline: float) -> CallResult:
        """Await ``awaitable`` until ``deadline`` (the loop's clock); past it, cancel it and
        stop waiting."""
        task = asyncio.ensure_future(awaitable)
        remaining = max(0.0, deadline - asyncio.get_running_loop().time())
        try:
            done, _ = await asyncio.wait({task}, timeout=remaining)
        except asyncio.CancelledError:
            task.cancel()
            raise
        if not done:
            task.cancel()
            task.add_done_callback(_retrieve)
            return TimedOut(self._timeout_s)
        if task.cancelled():
            return Raised(asyncio.CancelledError("the reward call was cancelled"))
        error = task.exception()
        return Raised(error) if error is not None else Returned(task.result())

    def _keywords(self, row: RewardInput) -> dict[str, Any]:
        keywords: dict[str, Any] = {
            "data_source": row.data_source,
            "solution_str": row.solution_str,
            "ground_truth": row.ground_truth,
        }
        if self._extra_info:
            keywords["extra_info"] = row.extra_info
        return keywords

    def _collect(self, rows: list[RewardInput], results: list[CallResult]) -> RewardOutcome:
        scores: list[float] = []
        extra: dict[str, list[float]] = {}
        failed_rows: list[int] = []
        messages: list[str] = []
        first_cause: BaseException | None = None
        for position, (row, result) in enumerate(zip(rows, results, strict=True)):
            index = position if row.row is None else row.row
            verdict = judge(result)
            if isinstance(verdict, Failed):
                if not failed_rows:
                    first_cause = verdict.cause
                failed_rows.append(index)
                messages.append(
                    f"reward function {self._label} failed on row {index} "
                    f"(data_source {row.data_source!r}): {verdict.what}"
                )
                scores.append(0.0)
            else:
                scores.append(verdict.score)
                for key, value in verdict.extra.items():
                    extra.setdefault(key, [math.nan] * position).append(value)
            for column in extra.values():
                if len(column) <= position:
                    column.append(math.nan)
        if failed_rows:
            if self._on_error == "raise":
                raise RewardFunctionError(_raise_message(messages, failed_rows, len(rows))) from (
                    first_cause
                )
            logger.warning(
                "reward function %s failed on %d of %d rows (rows %s), each scored 0.0; "
                "the first: %s",
                self._label,
                len(failed_rows),
                len(rows),
                _listed(failed_rows),
                messages[0],
            )
        return RewardOutcome(scores, extra, failed_rows, messages)


def _raise_message(messages: list[str], failed_rows: list[int], total: int) -> str:
    if len(messages) == 1:
        return messages[0]
    others = len(messages) - 1
    return (
        f"{messages[0]}\n({others} more of the batch's {total} rows failed too: rows "
        f"{_listed(failed_rows[1:])})"
    )


def _listed(rows: list[int]) -> str:
    shown = ", ".join(str(row) for row in rows[:_LISTED_ROWS])
    return shown + (", ..." if len(rows) > _LISTED_ROWS else "")


def _retrieve(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of a call given up on as seen, so that asyncio does not log it."""
    if not task.cancelled():
        task.exception()
