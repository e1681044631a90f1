"""``RayBackend``: sc-core's :class:`~sc_core.backend.Backend` over one Ray actor per rank.

:meth:`RayBackend.start` puts each distinct large argument (a DataProto, a tensor, an
array...) into the object store once, in parallel, gives every rank that receives it the same
reference, and submits one actor method per rank: the method's twin (``_sc_m_<name>``, see
``_actor_class.py``), or, for a non-blocking call of a splitting mode, the entry point that
also returns the shard's row count (its references travel in the call handle's ``state``).
:meth:`RayBackend.wait` fetches the values within the call's deadline and maps failures to
sc-core's errors as soon as one rank fails.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sc_core import CallTimeoutError, WorkerDiedError, WorkerError, WorkerGroupError
from sc_core.backend import (
    Call,
    CallHandle,
    RankArgs,
    ReplacedWorkers,
    caused_by_peer,
    on_control_lane,
    reported_rank,
)
from sc_dispatch.ext import is_future

from . import _ray_api as rapi
from ._actor_class import CALL_METHOD, CONTROL_GROUP, META_METHOD, TAKE_OVER_METHOD, TWIN_PREFIX
from ._actor_launch import LaunchSpec, rank_env, relaunch_actors, rendezvous_address
from ._futures import Deadline, RayFuture, await_with_deadline
from ._nbytes import INLINE_LIMIT, estimate_nbytes, is_bulk
from ._shared import private_on_load
from ._standby import Spare, Standby, take_over_args
from ._wire import ensure_tensordict_wire, is_tensordict

__all__ = ["RayBackend", "wait_refs"]

logger = logging.getLogger("sc_ray")

#: How often a blocking wait looks at the ranks that already answered (seconds): a failed
#: or dead rank is reported within this long even while other ranks keep running.
_POLL_S = 0.25
#: how long a call whose only errors say another rank caused them waits for that rank's own
#: error (it arrives a moment later: the rank fails first, then its peers notice)
_PEER_GRACE_S = 5.0
#: how long ``replace_ranks`` waits for the cluster to report a dead rank's actor dead: a
#: call finds an actor on a lost node unreachable at once, but the cluster reports it dead
#: (and places its node's placement group again) only once its health checks of the node
#: have failed (about 15 s with Ray's defaults). An actor still reported alive after this
#: long is killed and replaced where it was.
REPORTED_DEAD_WAIT_S = 60.0

_put_pool_lock = threading.Lock()
_put_pool: concurrent.futures.ThreadPoolExecutor | None = None


def _put_all(values: list[Any]) -> list[rapi.ObjectRef]:
    """Put ``values`` into the object store (in parallel when there are several)."""
    global _put_pool
    if len(values) == 1:
        return [rapi.put(values[0])]
    with _put_pool_lock:
        if _put_pool is None:
            _put_pool = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="sc-ray-put")
        pool = _put_pool
    return list(pool.map(rapi.put, values))


class RayBackend:
    """Runs calls on ``workers`` (Ray actor handles, in rank order)."""

    def __init__(
        self,
        name_prefix: str,
        workers: list[rapi.ActorHandle],
        twins: frozenset[str],
        *,
        release_attached_pgs: bool,
        probe_timeout: float,
        launch: LaunchSpec | None = None,
        names: list[str] | None = None,
        control_lane: bool = False,
    ) -> None:
        self.name_prefix = name_prefix
        self.workers = workers
        #: whether the actors have the control lane's concurrency group (a detached group's
        #: do: ``_actor_class.CONTROL_GROUP``), where sc-core's control calls then run
        self.control_lane = control_lane
        #: How the actors were created (``None`` for a group attached to detached actors),
        #: and their names (the group's own list), for :meth:`replace`.
        self._launch = launch
        self._names = names if names is not None else [""] * len(workers)
        self._generation = 0
        self._twins = twins
        #: A group attached with from_detached has no pool object: the placement groups its
        #: actors run in are found through the actors (before they are killed) on close.
        self.release_attached_pgs = release_attached_pgs
        self._probe_timeout = probe_timeout
        self._closed = False
        #: the group's spare actors (``RayWorkerGroup(standby=N)``), if any
        self.standby: Standby | None = None
        #: called after every replacement with the names of all ranks' actors, the new
        #: rendezvous address and port, and the generation (a run records them)
        self.on_replaced: Callable[[list[str], str, str, int], None] | None = None

    def resume(self, launch: LaunchSpec, generation: int) -> None:
        """Let a group rebuilt over live actors (a run's re-attach) replace ranks as the
        group that created them would: on ``launch``'s pool, numbering from ``generation``."""
        self._launch = launch
        self._generation = generation
        self.release_attached_pgs = False

    # --- start -----------------------------------------------------------------------------

    def _put_shared(self, rank_args: Sequence[RankArgs], call: Call) -> Sequence[RankArgs]:
        """Put each bulk value into the object store once and pass its reference: a value
        that several ranks receive, or one large enough that Ray would put it anyway. A
        small value for one rank travels inline in the task, which spares the rank a fetch
        from the driver (a micro-shard of a few rows, most often)."""
        distinct: list[Any] = []
        seen_once: list[Any] = []
        shared: list[Any] = []  # received by several ranks
        for args, kwargs in rank_args:
            for value in (*args, *kwargs.values()):
                if any(value is seen for seen in distinct):
                    if not any(value is seen for seen in shared):
                        shared.append(value)
                    continue
                if is_future(value) or not is_bulk(value):
                    continue
                if any(value is seen for seen in seen_once):
                    distinct.append(value)
                    shared.append(value)
                elif estimate_nbytes(value) >= INLINE_LIMIT:
                    distinct.append(value)
                else:
                    seen_once.append(value)
        if any(is_tensordict(v) for v in (*distinct, *seen_once)):
            ensure_tensordict_wire()
        if not distinct:
            return rank_args
        # A batch several ranks read from one store entry unpickles as a copy on each rank
        # (_shared.py): an in-place write on one rank must not reach its peers.
        refs = _put_all(
            [private_on_load(v) if any(v is s for s in shared) else v for v in distinct]
        )
        if call.span.recording:
            call.span.add_bytes(put=sum(estimate_nbytes(v) for v in distinct))

        def swap(value: Any) -> Any:
            for seen, ref in zip(distinct, refs, strict=True):
                if value is seen:
                    return ref
            return value

        return [
            (tuple(swap(a) for a in args), {k: swap(v) for k, v in kwargs.items()})
            for args, kwargs in rank_args
        ]

    def _lane(self, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """The concurrency group one rank's call runs in: the control lane's for what
        sc-core puts there (``sc_core.backend.on_control_lane``), when the actors have it."""
        if self.control_lane and on_control_lane(method_name, args, kwargs):
            return CONTROL_GROUP
        return None

    def start(self, call: Call, method_name: str, rank_args: Sequence[RankArgs]) -> CallHandle:
        rank_args = self._put_shared(rank_args, call)
        workers = self.workers
        if not call.blocking and call.row_aligned:
            values: list[Any] = []
            metas: list[Any] = []
            for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True):
                lane = self._lane(method_name, args, kwargs)
                meta, value = rapi.call_actor_multi(
                    workers[rank], META_METHOD, (method_name, *args), kwargs, 2, lane
                )
                metas.append(meta)
                values.append(value)
            return CallHandle(call, values, metas)
        if method_name in self._twins:
            twin = f"{TWIN_PREFIX}{method_name}"
            refs = [
                rapi.call_actor(
                    workers[rank], twin, args, kwargs, self._lane(method_name, args, kwargs)
                )
                for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True)
            ]
        else:
            refs = [
                rapi.call_actor(
                    workers[rank],
                    CALL_METHOD,
                    (method_name, *args),
                    kwargs,
                    self._lane(method_name, args, kwargs),
                )
                for rank, (args, kwargs) in zip(call.ranks, rank_args, strict=True)
            ]
        return CallHandle(call, refs)

    # --- wait ------------------------------------------------------------------------------

    def wait(self, handle: CallHandle) -> list[Any]:
        call = handle.call
        return wait_refs(
            handle.rank_handles, call.ranks, call.method_name, call.deadline, call.timeout, call
        )

    # --- non-blocking calls ------------------------------------------------------------------

    def pending(self, handle: CallHandle) -> list[Any]:
        """Non-blocking calls return Ray object references, as in verl; splitting modes get
        futures that also know their row counts (joined into a DataProtoFuture).

        A call with a deadline keeps it however its result is consumed: the futures' ``get``
        (also inside a consumer worker) raises ``CallTimeoutError`` once it has passed, and
        the references of the other modes are those of small tasks that wait for the value
        until the deadline, so that ``ray.get`` raises it too."""
        call = handle.call
        remaining = call.remaining()
        deadline = (
            None
            if remaining is None or call.timeout is None
            else Deadline(time.time() + remaining, call.timeout, call.method_name, call.ranks)
        )
        if handle.state is None:
            if deadline is None:
                return list(handle.rank_handles)
            return [
                rapi.run_task(
                    await_with_deadline,
                    {"num_cpus": 0, "max_retries": 0},
                    ([ref], deadline, rank),
                )
                for rank, ref in zip(call.ranks, handle.rank_handles, strict=True)
            ]
        return [
            RayFuture(ref, meta, call.method_name, rank, deadline)
            for rank, ref, meta in zip(call.ranks, handle.rank_handles, handle.state, strict=True)
        ]

    # --- the rest of the contract ---------------------------------------------------------------

    def is_done(self, rank_handle: Any) -> bool:
        return not rapi.is_object_ref(rank_handle) or rapi.is_ready(rank_handle)

    def wait_any(self, rank_handles: Sequence[Any], timeout: float | None) -> list[int]:
        """Positions of the finished calls among ``rank_handles`` (``ray.wait`` for the
        first, up to ``timeout`` seconds; an error counts as finished)."""
        refs = [h for h in rank_handles if rapi.is_object_ref(h)]
        if len(refs) < len(rank_handles):
            return [i for i, h in enumerate(rank_handles) if not rapi.is_object_ref(h)]
        ready, _ = rapi.wait(refs, 1, timeout)
        ready_ids = {id(r) for r in ready}
        return [i for i, h in enumerate(rank_handles) if id(h) in ready_ids]

    def cancel(self, rank_handle: Any) -> bool:
        return rapi.is_object_ref(rank_handle) and rapi.cancel(rank_handle)

    def is_alive(self, rank: int) -> bool:
        return rapi.actor_state(self.workers[rank]) != "DEAD"

    def replace(self, ranks: Sequence[int], timeout: float) -> ReplacedWorkers:
        """Kill what is left of the actors of ``ranks`` and put new ones in their places (same
        environment, a new rendezvous port on rank 0's node): a spare of the group's standby
        on the rank's node where there is one, else a new actor on the rank's bundle; waits
        up to ``timeout`` seconds for their constructors; on a failure the new actors are
        killed. A rank whose node was lost first waits until the cluster reports its actor
        dead (at most :data:`REPORTED_DEAD_WAIT_S`), then, up to the pool's placement deadline,
        for Ray to place its bundle on a live node (:class:`RankPlacementTimeoutError`
        otherwise, before any new actor is created)."""
        spec = self._launch
        if spec is None:
            raise WorkerGroupError(
                f"RayWorkerGroup {self.name_prefix!r}.replace_ranks: the group was attached "
                "to detached actors (from_detached) and has no pool to start new ones in"
            )
        where = f"RayWorkerGroup {self.name_prefix!r}.replace_ranks"
        self._await_reported_dead(ranks, where)
        for rank in ranks:
            rapi.kill(self.workers[rank])
        # a rank whose node was lost waits for Ray to place its bundle on a live node
        spec.pool.wait_ranks_placed(ranks, where=where, group=self.name_prefix)
        self._generation += 1
        slots = spec.pool.bundle_slots()
        takers: dict[int, Spare] = {}
        if self.standby is not None:
            for rank in ranks:
                spare = self.standby.take(slots[rank].node_index)
                if spare is not None:
                    takers[rank] = spare
        fresh = [r for r in ranks if r not in takers]
        created: dict[int, rapi.ActorHandle] = {}
        try:
            if fresh:
                names, addr, port = relaunch_actors(
                    spec, fresh, self._generation, timeout=timeout, created=created
                )
            else:
                names = {}
                addr, port = rendezvous_address(spec, timeout)
            refs = [rapi.ready_ref(created[r]) for r in fresh]
            for rank, spare in takers.items():
                created[rank], names[rank] = spare.actor, spare.name
                env = rank_env(spec, slots[rank], rank, len(slots), addr, port)
                devices = self.standby.devices[rank] if self.standby is not None else None
                refs.append(
                    rapi.call_actor(
                        spare.actor,
                        TAKE_OVER_METHOD,
                        take_over_args(env, devices, spec.cia.args, spec.cia.kwargs),
                        {},
                    )
                )
            deadline = time.monotonic() + timeout
            wait_refs(refs, (*fresh, *takers), "__init__", deadline, timeout, None)
        except BaseException:
            for worker in created.values():
                rapi.kill(worker)
            raise
        for rank in ranks:
            self.workers[rank] = created[rank]
            self._names[rank] = names[rank]
        if self.on_replaced is not None:
            self.on_replaced(list(self._names), addr, port, self._generation)
        return ReplacedWorkers(dict(created), addr, port)

    def _await_reported_dead(self, ranks: Sequence[int], where: str) -> None:
        """Wait until the cluster reports the actors of ``ranks`` dead, at most
        :data:`REPORTED_DEAD_WAIT_S`: a rank a call found unreachable may be on a node that
        was lost and not yet declared dead; its bundle (and a spare there) still look
        placed on that node until it is."""
        deadline = rapi.monotonic() + REPORTED_DEAD_WAIT_S
        alive = [r for r in ranks if rapi.actor_state(self.workers[r]) == "ALIVE"]
        if alive:
            logger.info(
                "%s: the cluster still reports ranks %s alive; waiting up to %.0f s for it to "
                "report them dead (a lost node is declared dead by health checks)",
                where,
                alive,
                REPORTED_DEAD_WAIT_S,
            )
        while alive and rapi.monotonic() < deadline:
            time.sleep(_POLL_S)
            alive = [r for r in alive if rapi.actor_state(self.workers[r]) == "ALIVE"]
        if alive:
            logger.warning(
                "%s: the cluster reports ranks %s alive %.0f s after they were found dead; "
                "killing them and replacing them where they were",
                where,
                alive,
                REPORTED_DEAD_WAIT_S,
            )

    def close(self) -> None:
        """Kill every actor (detached ones too); a group attached with ``from_detached``
        also removes the placement groups its actors ran in, unless told not to."""
        if self._closed:
            return
        self._closed = True
        attached: dict[str, rapi.PlacementGroup] = {}
        if self.release_attached_pgs:
            for worker in self.workers:
                try:
                    pg = rapi.actor_placement_group(worker, timeout_s=self._probe_timeout)
                except Exception:  # a dead actor has nothing to ask; its group may still
                    continue
                if pg is not None:
                    attached[rapi.placement_group_id(pg)] = pg
        for worker in self.workers:
            rapi.kill(worker)
        if self.standby is not None:
            self.standby.close()
        for pg in attached.values():
            rapi.remove_placement_group(pg)
            logger.info(
                "released placement group %s of an attached group", rapi.placement_group_id(pg)
            )


def wait_refs(
    refs: Sequence[rapi.ObjectRef],
    ranks: Sequence[int],
    method: str,
    deadline: float | None,
    timeout: float | None,
    call: Call | None,
) -> list[Any]:
    """The values of ``refs`` (one per rank in ``ranks``); raises as soon as a rank
    fails (after up to ``_PEER_GRACE_S`` more when every error so far says another rank
    caused it, for that rank's own error), or when the deadline passes.

    The common case costs one ``ray.get`` (without a timeout when the call has no deadline:
    a timed ``ray.get`` costs a few per cent more on a no-op call). ``ray.get`` of a list
    raises as soon as any of its objects holds an error, so a failed or dead rank ends it
    while other ranks still run; the ranks are then polled one by one with ``ray.wait`` to
    find which failed."""
    start = time.time()
    first = None if deadline is None else max(0.0, deadline - time.monotonic())
    try:
        got = rapi.get(refs, timeout_s=first)
    except Exception:  # a timeout or a failure: find out rank by rank below
        pass
    else:
        _record(call, ranks, range(len(refs)), got, start)
        return got
    pending: dict[int, rapi.ObjectRef] = dict(enumerate(refs))
    values: list[Any] = [None] * len(refs)
    failures: dict[int, rapi.RemoteFailure] = {}
    grace_until: float | None = None
    while pending:
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        slice_s = _POLL_S if remaining is None else min(_POLL_S, remaining)
        ready, _ = rapi.wait(list(pending.values()), len(pending), slice_s)
        if ready:
            ready_ids = {id(r) for r in ready}
            done = [i for i, r in pending.items() if id(r) in ready_ids]
            _collect(done, pending, values, ranks, call, start, failures)
        if failures:
            # an error that says a peer caused it waits briefly for the peer's own
            if grace_until is None:
                grace_until = time.monotonic() + _PEER_GRACE_S
            own = any(not caused_by_peer(f.cause) for f in failures.values())
            died = any(f.kind == "died" for f in failures.values())
            if own or died or time.monotonic() >= grace_until:
                _raise_failures(failures, method)
        if not ready and remaining is not None and remaining <= 0:
            if failures:
                _raise_failures(failures, method)
            waiting = [ranks[i] for i in sorted(pending)]
            raise CallTimeoutError(method, waiting, timeout)
    if failures:
        _raise_failures(failures, method)
    return values


def _record(
    call: Call | None, ranks: Sequence[int], done: Sequence[int], got: list[Any], start: float
) -> None:
    if call is None or not call.span.recording:
        return
    now = time.time()
    for i in done:
        call.span.add_phase("execute", start, now, ranks[i])
    call.span.add_bytes(fetched=sum(estimate_nbytes(v) for v in got))


def _collect(
    done: list[int],
    pending: dict[int, rapi.ObjectRef],
    values: list[Any],
    ranks: Sequence[int],
    call: Call | None,
    start: float,
    failures: dict[int, rapi.RemoteFailure],
) -> None:
    """Move the ``done`` ranks' values into ``values`` and their errors into ``failures``."""
    try:
        got = rapi.get([pending[i] for i in done])
    except Exception:
        got = None
    if got is not None:
        for i, value in zip(done, got, strict=True):
            values[i] = value
            del pending[i]
        _record(call, ranks, done, got, start)
        return
    for i in done:
        try:
            values[i] = rapi.get([pending[i]])[0]
        except Exception as exc:
            failures[ranks[i]] = rapi.classify_failure(exc)
        del pending[i]


def _raise_failures(failures: Mapping[int, rapi.RemoteFailure], method: str) -> None:
    died = sorted(r for r, f in failures.items() if f.kind == "died")
    if died:
        reason = failures[died[0]].cause_type
        raise WorkerDiedError(method, died, reason) from failures[died[0]].cause
    first = reported_rank({rank: f.cause for rank, f in failures.items()})
    failure = failures[first]
    others = sorted(r for r in failures if r != first)
    if isinstance(failure.cause, WorkerError):  # raised by the worker's entry point
        raise failure.cause.with_other_failed_ranks(others) from failure.cause.cause
    raise WorkerError(
        method,
        first,
        failure.cause_type,
        str(failure.cause),
        failure.traceback,
        other_failed_ranks=others,
        cause=failure.cause,
    ) from failure.cause
