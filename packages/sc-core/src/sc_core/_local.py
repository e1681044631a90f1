"""``LocalWorkerGroup``: the in-process backend.

Every rank's worker is an ordinary object in this process, with an environment of its own
(WORLD_SIZE, RANK, ... through :func:`~sc_core.backend.worker_context`; ``os.environ`` is never
written). Each rank has a daemon thread that builds its worker and runs its calls in order,
with an asyncio event loop of its own for ``async def`` methods. By default the ranks take
turns: a call runs on rank 0, then rank 1, ... and one call finishes before the next starts,
so output and breakpoints come one rank at a time. The driver waits for the rank threads
within each call's deadline. A rank's control lane (``_lanes.py``: the framework's queries,
calls answered from the journal) runs on a second thread of the rank, made on first use,
beside whatever the rank runs and outside the turns.
"""

from __future__ import annotations

import concurrent.futures
import functools
import inspect
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, cast

from ._backend import CallHandle, RankArgs, ReplacedWorkers
from ._call import Call
from ._colocate import unwrap_worker_cls
from ._context import InProcessRendezvous, worker_context
from ._errors import (
    CallTimeoutError,
    ConfigTypeError,
    InvalidConfigError,
    ResourcePoolError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupError,
    reported_rank,
)
from ._faults import take_fault
from ._fused import check_fused_worker_used
from ._future import LazyFuture
from ._journal import run_journaled
from ._lanes import on_control_lane
from ._local_runner import LocalHandle, Outcome, RankRunner, Turns, worker_traceback
from ._resource import ClassWithInitArgs, ResourcePool
from ._settings import LOCAL_INLINE, RENDEZVOUS
from ._worker import Worker
from ._worker_group import W, WorkerGroup

__all__ = ["LocalBackend", "LocalHandle", "LocalWorkerGroup"]

logger = logging.getLogger("sc_core.local")


class LocalBackend:
    """The in-process :class:`~sc_core.backend.Backend`: one thread (or the calling thread, inline)
    per rank, each with the rank's environment."""

    def __init__(
        self, name_prefix: str, envs: list[dict[str, str]], *, concurrent: bool, inline: bool
    ) -> None:
        self.name_prefix = name_prefix
        self.workers: list[Any] = []
        self._envs = envs
        self._concurrent = concurrent
        self._inline = inline
        self._rendezvous = InProcessRendezvous()
        self.killed: set[int] = set()
        self._turns = Turns()
        self.runners: list[RankRunner] = [
            RankRunner(f"sc-local-{name_prefix}-rank{rank}", inline) for rank in range(len(envs))
        ]
        #: each rank's control lane (a thread of its own, made on first use)
        self.control_runners: dict[int, RankRunner] = {}
        self._control_lock = threading.Lock()
        #: Builds one rank's worker (set by the group; :meth:`replace` needs it).
        self.factory: Callable[[], Any] | None = None
        self._generation = 0

    # --- running code on a rank --------------------------------------------------------------

    def _in_rank(self, rank: int, fn: Callable[[], Any]) -> Outcome:
        """Run ``fn`` as rank ``rank`` (its environment, its event loop); never raises."""
        return self._run_as(self._envs[rank], self.runners[rank], fn)

    def _run_as(self, env: dict[str, str], runner: RankRunner, fn: Callable[[], Any]) -> Outcome:
        """Run ``fn`` with environment ``env`` and ``runner``'s event loop; never raises."""
        start = time.time()
        try:
            with worker_context(env, self._rendezvous):
                value = fn()
                if inspect.isawaitable(value):
                    value = runner.run_awaitable(value)
            return Outcome(value=value, start=start, end=time.time())
        except BaseException as exc:
            return Outcome(error=exc, traceback=worker_traceback(exc), start=start, end=time.time())

    def _control_runner(self, rank: int) -> RankRunner:
        """Rank ``rank``'s control lane: a thread beside the rank's own, made on first use."""
        with self._control_lock:
            runner = self.control_runners.get(rank)
            if runner is None:
                name = f"sc-local-{self.name_prefix}-rank{rank}-control-g{self._generation}"
                runner = self.control_runners[rank] = RankRunner(name, self._inline)
            return runner

    def construct(self, rank: int, factory: Callable[[], Any]) -> Outcome:
        """Build rank ``rank``'s worker with ``factory`` on its thread; the outcome."""
        return self.runners[rank].submit(functools.partial(self._in_rank, rank, factory)).result()

    def submit(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> LocalHandle:
        """Start ``method_name`` on ``rank`` (after the group's previous call, unless
        ``concurrent`` or ``inline``)."""
        if not 0 <= rank < len(self.workers):
            raise WorkerGroupError(
                f"LocalWorkerGroup {self.name_prefix}.{method_name}: rank {rank} out of range "
                f"for world size {len(self.workers)}"
            )
        runners = self.runners
        if not runners:
            raise WorkerGroupError(
                f"LocalWorkerGroup {self.name_prefix}.{method_name}: the group is closed"
            )
        if rank in self.killed:
            fut: concurrent.futures.Future[Outcome] = concurrent.futures.Future()
            fut.set_result(Outcome(died=True))
            return LocalHandle(rank, method_name, fut)
        worker = self.workers[rank]
        control = on_control_lane(method_name, args, kwargs)
        runner = self._control_runner(rank) if control else runners[rank]

        def call(kw: dict[str, Any]) -> Any:
            value = getattr(worker, method_name)(*args, **kw)
            return runner.run_awaitable(value) if inspect.isawaitable(value) else value

        def run() -> Any:
            # a call with an id runs once per id (_journal.py); the method's own outcome only
            return run_journaled(worker, method_name, kwargs, call, args)

        if control:  # beside the rank's running call, outside the turns, no fault fired
            on_lane = functools.partial(self._run_as, self._envs[rank], runner, run)
            return LocalHandle(rank, method_name, runner.submit(on_lane))

        # bound now: a group closed while this call waits for its turn clears self.runners
        in_rank = functools.partial(self._run_as, self._envs[rank], runners[rank])

        def run_on_rank() -> Outcome:
            fault = take_fault(worker, method_name, args)
            if fault is None:
                return in_rank(run)
            if fault.action == "raise":
                return in_rank(lambda: fault.fire_in_process(rank))
            # an injected kill: the method runs (its result is lost), then the rank is dead
            in_rank(run)
            self.killed.add(rank)
            return Outcome(died=True)

        if self._concurrent or self._inline:
            return LocalHandle(rank, method_name, runners[rank].submit(run_on_rank))
        turns = self._turns
        with turns.lock:
            previous = turns.last

            def in_turn() -> Outcome:
                if previous is not None:
                    concurrent.futures.wait([previous])
                return run_on_rank()

            fut = runners[rank].submit(in_turn)
            turns.last = fut
        return LocalHandle(rank, method_name, fut)

    # --- the Backend contract ------------------------------------------------------------------

    def start(self, call: Call, method_name: str, rank_args: Sequence[RankArgs]) -> CallHandle:
        return CallHandle(
            call,
            [
                self.submit(rank, method_name, args, kwargs)
                for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True)
            ],
        )

    def wait(self, handle: CallHandle) -> list[Any]:
        return self.wait_handles(handle.rank_handles, handle.call)

    def wait_handles(self, handles: Sequence[Any], call: Call) -> list[Any]:
        outcomes: list[Outcome] = []
        for i, handle in enumerate(handles):
            if not isinstance(handle, LocalHandle):
                raise WorkerGroupError(
                    f"LocalWorkerGroup {self.name_prefix}.{call.method_name}: expected "
                    f"LocalHandle, got {type(handle).__qualname__}"
                )
            try:
                outcomes.append(handle.future.result(timeout=call.remaining()))
            except concurrent.futures.TimeoutError:
                pending = [h.rank for h in handles[i:] if not h.future.done()]
                logger.warning(
                    "local worker group %s: %s timed out after %ss; ranks %s keep running",
                    self.name_prefix,
                    call.method_name,
                    call.timeout,
                    pending,
                )
                raise CallTimeoutError(call.method_name, pending, call.timeout) from None
        ranks = [h.rank for h in handles]
        span = call.span
        if span.recording and span.end is None:
            for rank, outcome in zip(ranks, outcomes, strict=True):
                if not outcome.died:
                    span.add_phase("execute", outcome.start, outcome.end, rank)
        died = [r for r, o in zip(ranks, outcomes, strict=True) if o.died]
        if died:
            raise WorkerDiedError(call.method_name, died, "killed with kill_worker")
        failed = {r: o for r, o in zip(ranks, outcomes, strict=True) if o.error is not None}
        if failed:
            rank = reported_rank({r: o.error for r, o in failed.items()})
            first = failed[rank]
            raise WorkerError.from_exception(
                call.method_name,
                rank,
                cast(BaseException, first.error),
                other_failed_ranks=[r for r in failed if r != rank],
                remote_traceback=first.traceback,
            )
        return [o.value for o in outcomes]

    def pending(self, handle: CallHandle) -> list[Any]:
        """Futures that wait for their rank when ``get()`` is called (within the deadline)."""
        call = handle.call
        return [
            LazyFuture(
                functools.partial(self._wait_one, h, call), f"{call.method_name} rank {h.rank}"
            )
            for h in handle.rank_handles
        ]

    def _wait_one(self, handle: LocalHandle, call: Call) -> Any:
        return self.wait_handles([handle], call)[0]

    def is_done(self, rank_handle: Any) -> bool:
        return not isinstance(rank_handle, LocalHandle) or rank_handle.future.done()

    def wait_any(self, rank_handles: Sequence[Any], timeout: float | None) -> list[int]:
        """Positions of the finished calls among ``rank_handles`` (after waiting up to
        ``timeout`` seconds for the first)."""
        futures = [h.future for h in rank_handles if isinstance(h, LocalHandle)]
        concurrent.futures.wait(futures, timeout, concurrent.futures.FIRST_COMPLETED)
        return [i for i, h in enumerate(rank_handles) if self.is_done(h)]

    def cancel(self, rank_handle: Any) -> bool:
        # A call still waiting for its rank's thread (or its turn) is dropped; one that runs
        # cannot be interrupted.
        return isinstance(rank_handle, LocalHandle) and rank_handle.future.cancel()

    def is_alive(self, rank: int) -> bool:
        return rank not in self.killed

    def replace(self, ranks: Sequence[int], timeout: float) -> ReplacedWorkers:
        """Build a new worker for each of ``ranks``, each on a rank thread of its own (the
        old thread is stopped once it has finished what it runs); every new environment has
        a new rendezvous port. A constructor runs to its end (no deadline in-process)."""
        factory = self.factory
        if factory is None or not self.runners:
            raise WorkerGroupError(
                f"LocalWorkerGroup {self.name_prefix}.replace_ranks: the group is closed or "
                "was built without a worker factory"
            )
        addr, port = Worker._get_node_ip(), str(Worker._get_free_port())
        self._generation += 1
        # the environments carry the new address: rank 0's new worker publishes it afresh
        self._rendezvous = InProcessRendezvous()
        built: dict[int, tuple[Any, dict[str, str], RankRunner]] = {}
        try:
            for rank in ranks:
                env = dict(self._envs[rank], MASTER_ADDR=addr, MASTER_PORT=port)
                name = f"sc-local-{self.name_prefix}-rank{rank}-g{self._generation}"
                runner = RankRunner(name, self._inline)
                built[rank] = (None, env, runner)
                outcome = runner.submit(
                    functools.partial(self._run_as, env, runner, factory)
                ).result()
                if outcome.error is not None:
                    raise WorkerError.from_exception(
                        f"{self.name_prefix}.replace_ranks (a new worker's __init__)",
                        rank,
                        outcome.error,
                        remote_traceback=outcome.traceback,
                    )
                built[rank] = (outcome.value, env, runner)
        except BaseException:
            for _, _, runner in built.values():
                runner.close()
            raise
        for rank, (worker, env, runner) in built.items():
            old = self.runners[rank]
            self._envs[rank], self.runners[rank], self.workers[rank] = env, runner, worker
            self.killed.discard(rank)
            old.close()
            with self._control_lock:
                control = self.control_runners.pop(rank, None)
            if control is not None:
                control.close()
        return ReplacedWorkers({r: w for r, (w, _, _) in built.items()}, addr, port)

    def close(self) -> None:
        _close_runners(self.runners, self.control_runners)


class LocalWorkerGroup(WorkerGroup[W]):
    """All ranks of a worker group as objects in this process (for tests and debugging).

    ``LocalWorkerGroup(resource_pool, ClassWithInitArgs(MyWorker, ...))`` builds
    ``resource_pool.world_size`` workers, rank by rank, and binds their registered methods
    like any worker group. A backend's wrapped class (``ray.remote``, unwrapped through
    :func:`~sc_core.backend.register_class_unwrapper`) and a backend's subclass of
    ``ClassWithInitArgs`` (``RayClassWithInitArgs``) are accepted: only the class and its
    arguments are used.

    ``concurrent=True`` runs the ranks of a call at the same time (each on its own thread)
    instead of one after the other; ``inline=True`` (or ``SC_CORE_LOCAL_INLINE=1``) runs every
    call on the calling thread, where a debugger that only follows the main thread can step
    into it; deadlines are then not enforced. :meth:`close` (or leaving a ``with`` block, or
    garbage collection) stops the rank threads.
    """

    def __init__(
        self,
        resource_pool: ResourcePool | None = None,
        cls_with_init: ClassWithInitArgs[W] | None = None,
        name_prefix: str | None = None,
        *,
        default_timeout: float | None = None,
        concurrent: bool = False,
        inline: bool | None = None,
    ) -> None:
        super().__init__(resource_pool, name_prefix=name_prefix, default_timeout=default_timeout)
        where = f"{type(self).__name__}"
        cia = cls_with_init
        if not isinstance(cia, ClassWithInitArgs):
            raise ConfigTypeError(
                f"{where}: cls_with_init must be a ClassWithInitArgs, got {type(cia).__qualname__}"
            )
        if resource_pool is None:
            raise InvalidConfigError(
                f"{where}: needs a ResourcePool (detached workers exist only on Ray)"
            )
        if resource_pool.world_size == 0:
            raise ResourcePoolError(
                f"{where}: the resource pool has no processes ({resource_pool})"
            )
        for flag_name, flag in (("concurrent", concurrent), ("inline", inline)):
            if flag is not None and not isinstance(flag, bool):
                raise ConfigTypeError(f"{where}: {flag_name} must be a bool, got {flag!r}")
        inline = LOCAL_INLINE.get() if inline is None else inline
        self._cls_with_init = cia
        self._worker_cls = unwrap_worker_cls(cia.cls)
        self.fused_worker_used = check_fused_worker_used(where, cia)
        world_size = resource_pool.world_size
        base_env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("MASTER_ADDR", "MASTER_PORT", *RENDEZVOUS.names)
        }
        local_sizes = resource_pool.local_world_size_list()
        local_ranks = resource_pool.local_rank_list()
        envs = [
            {
                **base_env,
                "WORLD_SIZE": str(world_size),
                "RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(local_sizes[rank]),
                "LOCAL_RANK": str(local_ranks[rank]),
                "WG_PREFIX": self.name_prefix,
                "WG_BACKEND": "local",
            }
            for rank in range(world_size)
        ]
        backend = self._local = LocalBackend(
            self.name_prefix, envs, concurrent=concurrent, inline=inline
        )
        self._finalizer = weakref.finalize(
            self, _close_runners, backend.runners, backend.control_runners
        )
        # Not ``cls_with_init()``: a backend's subclass (sc-ray's) may create an actor there.
        factory = functools.partial(self._worker_cls, *cia.args, **cia.kwargs)
        backend.factory = factory
        for rank in range(world_size):
            outcome = backend.construct(rank, factory)
            if outcome.error is not None:
                backend.close()
                raise WorkerError.from_exception(
                    f"{getattr(cia.cls, '__qualname__', cia.cls)}.__init__",
                    rank,
                    outcome.error,
                    remote_traceback=outcome.traceback,
                )
            backend.workers.append(outcome.value)
            self._workers.append(outcome.value)
            self._worker_names.append(f"{self.name_prefix}_rank{rank}")
        self._master_addr = envs[0].get("MASTER_ADDR")
        self._master_port = envs[0].get("MASTER_PORT")
        logger.debug(
            "local worker group %s: %d workers of %s built (inline=%s, concurrent=%s)",
            self.name_prefix,
            world_size,
            self._worker_cls,
            inline,
            concurrent,
        )
        self._attach_backend(backend)
        worker_cls = self._worker_cls
        self._bind_worker_method(
            worker_cls if isinstance(worker_cls, type) else type(self._workers[0])
        )

    def kill_worker(self, rank: int) -> None:
        """Simulate the death of ``rank``'s process: its calls now fail with
        :class:`~sc_core.WorkerDiedError` (the object itself is left alone)."""
        self._local.killed.add(self._checked_rank("kill_worker", rank))


def _close_runners(runners: list[RankRunner], control: dict[int, RankRunner]) -> None:
    for runner in [*runners, *control.values()]:
        runner.close()
    runners.clear()
    control.clear()
