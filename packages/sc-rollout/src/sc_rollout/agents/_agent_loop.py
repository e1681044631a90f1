"""``AgentLoop``: many agent sessions at once, bounded, each with a deadline, their outcomes
streamed to the caller as they finish.

The caller's agent is an ``async`` function ``agent(task, session)``: it drives one
:class:`~sc_rollout.AgentSession` (``await session.agenerate()``, ``session.append_tokens``)
and returns the session's reward, or ``None`` to let the loop's reward function score it.
:meth:`AgentLoop.submit` starts sessions; at most ``max_concurrency`` run at once (the
others wait, and their deadline has not started). Every session ends in exactly one
:class:`AgentOutcome`: ``"done"`` with its reward, or dropped with the reason recorded
(``"deadline"``, ``"error"``, ``"cancelled"``); nothing hangs on a stuck agent, since a
session past its deadline is cancelled and its request in flight aborted.

Sessions are grouped (GRPO's group: the samples of one prompt). :meth:`AgentLoop.take_groups`
returns the first ``n`` groups whose sessions have all ended, in the order they ended, while
the others go on running: a batch made of the first groups to finish does not wait for the
slowest agents (*streaming*), and what is left over is cancelled or kept for the next batch.

The event loop runs in a thread of its own, so a synchronous driver calls every method.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable

from .._errors import (
    AgentLoopClosedError,
    RolloutRequestError,
    RolloutTimeoutError,
    RolloutTypeError,
)
from ..engines._engine import RolloutEngine
from ..engines._types import check_int
from ..routing._router import Router
from ._agent_tasks import (
    AgentFn,
    AgentLoopConfig,
    AgentOutcome,
    AgentStatus,
    AgentTask,
    RewardFn,
)
from ._session import AgentSession

__all__ = ["AgentLoop"]

_log = logging.getLogger("sc_rollout.agent_loop")


class AgentLoop:
    """Runs ``agent`` over many :class:`AgentSession` s on ``engine`` (a
    :class:`~sc_rollout.Router` keeps each session on one server); see the module's
    documentation. ``reward`` scores a session whose agent returned ``None``.

    Thread-safe. :meth:`close` (or leaving a ``with`` block) cancels what still runs.
    """

    def __init__(
        self,
        engine: RolloutEngine | Router,
        agent: AgentFn,
        *,
        reward: RewardFn | None = None,
        config: AgentLoopConfig | None = None,
    ) -> None:
        if not callable(getattr(engine, "generate", None)):
            raise RolloutTypeError(
                f"AgentLoop(engine=...) takes a RolloutEngine or a Router, got "
                f"{type(engine).__name__}"
            )
        if not callable(agent):
            raise RolloutTypeError(f"AgentLoop(agent=...) must be callable, got {agent!r}")
        if reward is not None and not callable(reward):
            raise RolloutTypeError(f"AgentLoop(reward=...) must be callable, got {reward!r}")
        if config is None:
            config = AgentLoopConfig()
        elif not isinstance(config, AgentLoopConfig):
            raise RolloutTypeError(
                f"AgentLoop(config=...) takes an AgentLoopConfig, got {type(config).__name__}"
            )
        self.engine = engine
        self.config = config
        self._agent = agent
        self._reward = reward
        self._pool = concurrent.futures.ThreadPoolExecutor(
            config.max_concurrency, thread_name_prefix="sc-agent-turn"
        )
        self._cond = threading.Condition()
        #: session id -> (its task, the asyncio task running it)
        self._running: dict[str, tuple[AgentTask, asyncio.Task[AgentOutcome]]] = {}
        self._groups: dict[str, list[AgentOutcome]] = {}  # group -> ended, in the group
        self._members: dict[str, list[str]] = {}  # group -> its session ids, as submitted
        self._finished: list[str] = []  # groups whose sessions all ended, in that order
        #: every session id submitted and not handed out (running, or ended in a group not
        #: taken nor discarded yet) -> its group: such an id is refused by submit()
        self._held_ids: dict[str, str] = {}
        self._closed = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="sc-agent-loop", daemon=True
        )
        self._thread.start()
        self._gate = asyncio.run_coroutine_threadsafe(self._make_gate(), self._loop).result()

    async def _make_gate(self) -> asyncio.Semaphore:
        return asyncio.Semaphore(self.config.max_concurrency)

    # --- submitting ---------------------------------------------------------------------------

    def submit(self, tasks: Iterable[AgentTask]) -> int:
        """Start a session for each of ``tasks``; returns how many.

        The tasks of one group are submitted together: a group submitted before and not yet
        taken is a :class:`~sc_rollout.RolloutRequestError`. So is a session id the loop
        holds, running or ended in a group not yet taken (its outcome would be handed out
        twice), and a session id twice in ``tasks``; the error names the id, and nothing of
        the batch is submitted. Once :meth:`take_groups` / :meth:`take_all` handed its group
        out (or :meth:`discard` dropped it), a session id is free again: submitting it
        starts a new, independent session (a new episode; with the config's seed it samples
        with the same derived seed as before, so vary the ids, or the seed, between steps
        for samples that differ)."""
        batch = list(tasks)
        for task in batch:
            if not isinstance(task, AgentTask):
                raise RolloutTypeError(
                    f"AgentLoop.submit: takes AgentTasks, got {type(task).__name__}"
                )
        with self._cond:
            if self._closed:
                raise AgentLoopClosedError("AgentLoop.submit: the loop is closed")
            members: dict[str, list[str]] = {}
            ids: set[str] = set()
            for task in batch:
                if task.group in self._members:
                    raise RolloutRequestError(
                        f"AgentLoop.submit: group {task.group!r} was submitted before; a "
                        "group's sessions are submitted together"
                    )
                self._check_new_id(task.session_id, ids)
                ids.add(task.session_id)
                members.setdefault(task.group, []).append(task.session_id)
            self._members.update(members)
            for group, sids in members.items():
                self._held_ids.update(dict.fromkeys(sids, group))
            for group in members:
                self._groups[group] = []
            futures = [
                asyncio.run_coroutine_threadsafe(self._start(task), self._loop) for task in batch
            ]
        for future in futures:
            future.result()  # each session's task is registered once this returns
        return len(batch)

    def _check_new_id(self, session_id: str, batch: set[str]) -> None:
        """Refuse ``session_id`` if the loop holds it or the batch has it (under the lock)."""
        where = f"AgentLoop.submit: session id {session_id!r}"
        if session_id in batch:
            raise RolloutRequestError(f"{where} appears twice in the tasks submitted")
        group = self._held_ids.get(session_id)
        if group is None:
            return
        ended = any(o.task.session_id == session_id for o in self._groups.get(group, ()))
        state = "has ended" if ended else "is still running"
        raise RolloutRequestError(
            f"{where} was submitted before and {state} in group {group!r}, which was not taken "
            "yet; a session id may be submitted again once take_groups() / take_all() "
            "handed its group out (or discard() dropped it)"
        )

    async def _start(self, task: AgentTask) -> None:
        handle = asyncio.ensure_future(self._run(task))
        with self._cond:
            self._running[task.session_id] = (task, handle)

    async def _run(self, task: AgentTask) -> AgentOutcome:
        # every argument was checked by AgentTask and AgentLoop: this does not raise
        session = AgentSession(
            self.engine,
            task.prompt_ids,
            session_id=task.session_id,
            sampling=self.config.session_sampling(task.session_id),
            executor=self._pool,
        )
        started = time.monotonic()
        status: AgentStatus = "error"
        reward: float | None = None
        detail = ""
        try:
            async with self._gate:
                started = time.monotonic()
                try:
                    value = await asyncio.wait_for(
                        self._agent(task, session), self.config.deadline_s
                    )
                    reward = self._score(task, session, value)
                    status = "done"
                except asyncio.TimeoutError:
                    deadline = self.config.deadline_s
                    if deadline is None or time.monotonic() - started < deadline:
                        raise  # the agent's own timeout: an error, not the deadline
                    status = "deadline"
                    detail = f"ran past its deadline of {deadline} s"
        except asyncio.CancelledError:
            status, detail = "cancelled", "cancelled by AgentLoop.cancel"
        except Exception as exc:  # an agent's failure is recorded, never raised here
            status, detail = "error", f"{type(exc).__name__}: {exc}"
        finally:
            session.close()  # aborts a turn still in flight
        await _turn_ended(session)
        seconds = time.monotonic() - started
        if status in ("deadline", "error"):
            _log.warning("agent session %s %s: %s", task.session_id, status, detail)
        elif status == "cancelled":  # asked for (a batch's groups left over)
            _log.debug("agent session %s cancelled", task.session_id)
        outcome = AgentOutcome(task, status, reward, session.to_dict(), detail, seconds)
        self._ended(outcome)
        return outcome

    def _score(self, task: AgentTask, session: AgentSession, value: object) -> float:
        where = f"AgentLoop: session {task.session_id}"
        if value is None:
            if self._reward is None:
                raise RolloutTypeError(
                    f"{where}: the agent returned None and the AgentLoop has no reward "
                    "function; return the reward or give AgentLoop(reward=...)"
                )
            value = self._reward(task, session)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise RolloutTypeError(f"{where}: the reward must be a number, got {value!r}")
        reward = float(value)
        if not math.isfinite(reward):
            raise RolloutRequestError(f"{where}: the reward must be finite, got {value!r}")
        return reward

    def _ended(self, outcome: AgentOutcome) -> None:
        group = outcome.task.group
        with self._cond:
            self._running.pop(outcome.task.session_id, None)
            members = self._groups.setdefault(group, [])
            members.append(outcome)
            if len(members) == len(self._members.get(group, ())):
                self._finished.append(group)
            self._cond.notify_all()

    # --- taking -------------------------------------------------------------------------------

    @property
    def running(self) -> int:
        """Sessions not ended yet (waiting for a slot or running)."""
        with self._cond:
            return len(self._running)

    def finished_groups(self) -> int:
        """Groups whose sessions have all ended and that were not taken yet."""
        with self._cond:
            return len(self._finished)

    def pending_groups(self) -> int:
        """Groups submitted and not taken (nor discarded) yet, ended or not."""
        with self._cond:
            return len(self._members)

    def take_groups(self, count: int, timeout: float | None = None) -> list[list[AgentOutcome]]:
        """The first ``count`` groups whose sessions have all ended (in the order they
        ended, each group's outcomes in its tasks' submission order), removed from the loop;
        waits for them. More than the groups submitted and not taken is a
        :class:`~sc_rollout.RolloutRequestError`; ``timeout`` seconds without enough is an
        :class:`~sc_rollout.RolloutTimeoutError` (nothing is taken). The session ids of
        the groups taken may be submitted again (see :meth:`submit`)."""
        check_int(count, "AgentLoop.take_groups(count)", 1)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            available = len(self._members)
            if count > available:
                raise RolloutRequestError(
                    f"AgentLoop.take_groups: {count} groups asked, {available} submitted and "
                    "not taken"
                )
            self._wait(
                lambda: len(self._finished) >= count,
                deadline,
                lambda: (
                    f"AgentLoop.take_groups: {len(self._finished)} of {count} groups ended "
                    f"within {timeout} s ({len(self._running)} sessions still running)"
                ),
            )
            taken, self._finished = self._finished[:count], self._finished[count:]
            out = []
            for group in taken:
                order = {sid: i for i, sid in enumerate(self._members.pop(group))}
                self._release_ids(order)
                ended = self._groups.pop(group)
                out.append(sorted(ended, key=lambda m: order[m.task.session_id]))
            return out

    def _release_ids(self, session_ids: Iterable[str]) -> None:
        """Free the session ids of a group handed out or discarded (under the lock)."""
        for session_id in session_ids:
            self._held_ids.pop(session_id, None)

    def take_all(self, timeout: float | None = None) -> list[list[AgentOutcome]]:
        """Every group submitted and not taken, once all have ended (see
        :meth:`take_groups`); ``[]`` if there are none."""
        with self._cond:
            count = len(self._members)
        return self.take_groups(count, timeout) if count else []

    def cancel(self, groups: Iterable[str] | None = None) -> int:
        """Cancel the running sessions of ``groups`` (``None``: every group); each ends as
        ``"cancelled"`` (its turn in flight aborted, its tokens so far kept). Returns how many
        were running."""
        wanted = None if groups is None else set(groups)
        with self._cond:
            handles = [
                handle
                for task, handle in self._running.values()
                if wanted is None or task.group in wanted
            ]
        for handle in handles:
            self._loop.call_soon_threadsafe(handle.cancel)
        return len(handles)

    def _wait(
        self, done: Callable[[], bool], deadline: float | None, timed_out: Callable[[], str]
    ) -> None:
        """Wait on the held condition until ``done()``; at ``deadline`` (``time.monotonic``;
        ``None``: none) a :class:`~sc_rollout.RolloutTimeoutError` with ``timed_out()``."""
        while not done():
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise RolloutTimeoutError(timed_out())
            self._cond.wait(left)

    def discard(self, groups: Iterable[str] | None = None, timeout: float | None = 30.0) -> int:
        """Cancel ``groups`` (``None``: every group not taken) and forget them once their
        sessions ended (their session ids may be submitted again); returns how many groups
        were discarded."""
        with self._cond:
            chosen = list(self._members) if groups is None else list(groups)
        if not chosen:
            return 0
        self.cancel(chosen)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._wait(
                lambda: all(g in self._finished for g in chosen if g in self._members),
                deadline,
                lambda: (
                    f"AgentLoop.discard: sessions of {len(chosen)} groups still running "
                    f"after {timeout} s"
                ),
            )
            for group in chosen:
                if group in self._members:
                    self._release_ids(self._members.pop(group))
                    self._groups.pop(group, None)
                    self._finished.remove(group)
        return len(chosen)

    # --- closing ------------------------------------------------------------------------------

    def close(self) -> None:
        """Cancel every running session, wait for them to end, stop the loop's thread.
        Closing again does nothing."""
        with self._cond:
            if self._closed:
                return
            self._closed = True
        self.cancel()
        with self._cond:
            self._cond.wait_for(lambda: not self._running, timeout=30.0)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=30.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._loop.close()

    def __enter__(self) -> AgentLoop:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _turn_ended(session: AgentSession, timeout: float = 5.0) -> None:
    """Wait (up to ``timeout``) for an aborted turn to return its tokens to the session."""
    deadline = time.monotonic() + timeout
    while session.in_flight is not None and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
