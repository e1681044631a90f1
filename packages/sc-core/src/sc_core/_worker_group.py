"""``WorkerGroup``: the contract every backend's group keeps; it *holds* a backend.

A group binds every ``@register``-ed method of its worker class as an attribute (verl's
behaviour; ``_binding.py``), runs each call through the call path (``_call_path.py``: plan
→ start → wait, pending or stream → join), tracks dead and busy ranks (``_liveness.py``) and
makes one group per role of a colocated class (``_colocate.py``). What runs the workers is a
:class:`~sc_core.Backend` (``_backend.py``): a backend's group builds its workers, then calls
``self._attach_backend(backend)`` and ``self._bind_worker_method(worker_cls)``.

Every group has :meth:`WorkerGroup.close` (idempotent, also as a context manager); a closed
group's calls raise :class:`~sc_core.WorkerGroupClosedError`. A pool is released with the
last group that uses it.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, cast

from sc_dispatch import RegisteredMethod
from sc_dispatch.ext import MeshLayout

from . import _colocate, _faults, _fused, _replace
from ._backend import Backend
from ._binding import MethodProxy, bind_worker_methods
from ._busy import AbandonedCall
from ._call import check_timeout
from ._call_ids import CallIds, CallRecord, JournaledCall
from ._call_path import call_raw
from ._errors import (
    BackendNotImplementedError,
    ConfigTypeError,
    InvalidConfigError,
    UnknownMethodError,
    WorkerGroupClosedError,
    WorkerGroupError,
)
from ._faults import FaultAction
from ._lanes import JOURNAL_CALLS_METHOD, LAST_CALLS_METHOD
from ._meshes import MeshCache
from ._methods import MethodTable
from ._replay import TornCall, adopt_journals, check_scopes
from ._resource import ResourcePool
from ._runtime import GroupRuntime, Shared
from ._settings import ABORT_ON_WORKER_DEATH, CALL_TIMEOUT, WORKER_START_TIMEOUT
from ._worker import Worker

__all__ = ["MethodProxy", "WorkerGroup"]

logger = logging.getLogger("sc_core.worker_group")

Q = ParamSpec("Q")
C = TypeVar("C")
WG = TypeVar("WG", bound="WorkerGroup")

if TYPE_CHECKING:
    # The worker class of a group, for the type checker only (``sc_core.mypy_plugin`` types
    # ``wg.method(...)`` calls with it). It defaults to ``Any`` (PEP 696), so that a bare
    # ``WorkerGroup`` / ``class MyGroup(WorkerGroup)`` stays valid under ``mypy --strict``.
    # ``typing_extensions`` is read from the type checker's own stubs: nothing imports it.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    W = _TypeVarWithDefault("W", default=Any)
else:
    W = TypeVar("W")


class WorkerGroup(Generic[W]):
    """The base of every backend's worker group (verl's ``WorkerGroup``).

    After construction every ``@register``-ed method of the worker class is an attribute:
    ``wg.generate(batch)`` dispatches, executes on the workers, waits (if blocking) and
    collects. ``default_timeout`` (or ``SC_CORE_CALL_TIMEOUT_S``) bounds every call unless
    ``.options(timeout=...)`` says otherwise.

    For the type checker a group is generic in its worker class, ``WorkerGroup[MyWorker]``
    (inferred by the backends' constructors from ``ClassWithInitArgs(MyWorker, ...)``; a
    bare ``WorkerGroup`` means ``WorkerGroup[Any]``). ``wg.call(MyWorker.method, ...)``
    is typed for every checker; with ``plugins = ["sc_core.mypy_plugin"]`` mypy also types
    ``wg.method(...)`` itself.
    """

    fused_worker_execute_fn_name = "_fuw_execute"

    def __init__(
        self,
        resource_pool: ResourcePool | None,
        *,
        name_prefix: str | None = None,
        default_timeout: float | None = None,
    ) -> None:
        if resource_pool is not None and not isinstance(resource_pool, ResourcePool):
            raise ConfigTypeError(
                f"{type(self).__name__}: resource_pool must be a ResourcePool or None, "
                f"got {type(resource_pool).__qualname__}"
            )
        if name_prefix is not None and not isinstance(name_prefix, str):
            raise ConfigTypeError(
                f"{type(self).__name__}: name_prefix must be a str, "
                f"got {type(name_prefix).__qualname__} {name_prefix!r}"
            )
        if name_prefix is not None and not name_prefix:
            raise InvalidConfigError(
                f"{type(self).__name__}: name_prefix must be a non-empty str, got {name_prefix!r}"
            )
        # the state this group shares with its views, and its own table of bound methods
        self._sc_runtime = GroupRuntime()
        self._sc_runtime.views.add(self)
        self._sc_methods = MethodTable(self)
        self._resource_pool = resource_pool
        self.fused_worker_used = False
        self.name_prefix = name_prefix or secrets.token_hex(3)
        self.default_timeout = (
            check_timeout(f"{type(self).__name__}: default_timeout", default_timeout)
            if default_timeout is not None
            else CALL_TIMEOUT.get()
        )
        self._mesh_cache = MeshCache()  # query_mesh's layouts (see _meshes.py)
        self._user_defined_cls: type | None = None
        # The role of a group made by spawn_fused: its calls go through _fuw_execute.
        self._fused_role: str | None = None
        self.wg_dict: dict[str, WorkerGroup] | None = None
        self._spawned_from: WorkerGroup | None = None
        # the allocator of call ids (use_call_ids); None: calls carry no id
        self._sc_call_ids: CallIds | None = None

    # verl's names of the shared state, which a backend's group sets (kept in the runtime)
    _workers: Shared[list[Any]] = Shared("workers")
    _worker_names: Shared[list[str]] = Shared("worker_names")
    _master_addr: Shared[str | None] = Shared("master_addr")
    _master_port: Shared[str | None] = Shared("master_port")

    # --- the backend ----------------------------------------------------------------------

    def _attach_backend(self, backend: Backend, *, pool_acquired: bool = False) -> None:
        """Run this group's calls on ``backend`` (called once by a backend's constructor,
        after its workers exist). The group takes a share of its resource pool, released on
        :meth:`close`, unless the backend took it already (``pool_acquired``)."""
        if not isinstance(backend, Backend):
            raise ConfigTypeError(
                f"{type(self).__name__}._attach_backend: {type(backend).__qualname__} does not "
                "implement sc_core.Backend (start, wait, pending, is_done, cancel, is_alive, close)"
            )
        self._sc_runtime.backend = backend
        pool = self._resource_pool
        if pool is not None and not pool_acquired:
            pool._sc_acquire()
        self._sc_runtime.pool = pool

    def _sc_backend(self, method_name: str) -> Backend:
        """The backend that runs ``method_name``; a clear error when the group is closed,
        has no backend or no workers."""
        runtime = self._sc_runtime
        if runtime.closed:
            raise WorkerGroupClosedError(
                f"{type(self).__name__} {self.name_prefix!r}.{method_name}: the worker group "
                "was closed; create a new group"
            )
        backend = runtime.backend
        if backend is None:
            raise BackendNotImplementedError(
                f"{type(self).__qualname__}.{method_name}: the group has no backend; a "
                "backend's group attaches one with _attach_backend(backend) (see "
                "sc_core.Backend)"
            )
        if not runtime.workers:
            raise WorkerGroupError(
                f"{type(self).__name__}.{method_name}: the worker group has no workers"
            )
        if self._fused_role is not None:  # a role's group of a fused class (_fused.py)
            return _fused.FusedBackend(backend, self._fused_role, self.fused_worker_execute_fn_name)
        return backend

    # --- verl's execute API ----------------------------------------------------------------

    @property
    def world_size(self) -> int:
        """The number of workers."""
        return len(self._sc_runtime.workers)

    @property
    def workers(self) -> list[Any]:
        """The backend's worker handles, in rank order (a copy)."""
        return list(self._sc_runtime.workers)

    @property
    def worker_names(self) -> list[str]:
        return list(self._sc_runtime.worker_names)

    def query_mesh(self, mesh_name: str) -> MeshLayout:
        """The layout of mesh ``mesh_name`` (each rank's dp rank and collect flag), asked of
        the workers once and cached; a rank that never registered it is a
        :class:`~sc_dispatch.MeshLayoutError` naming the ranks. What N-d dispatch reads."""
        return self._mesh_cache.layout(self, mesh_name)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank and return one backend handle per rank. When
        every argument is a list of world-size entries, rank ``i`` gets entry ``i`` of each;
        otherwise every rank gets all the arguments (verl's rule)."""
        handles: list[Any] = call_raw(
            self, method_name, args, kwargs, rank_zero=False, blocking=False
        )
        return handles

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Start ``method_name`` on rank 0 only; return its backend handle."""
        return call_raw(self, method_name, args, kwargs, rank_zero=True, blocking=False)

    def execute_all_sync(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Run ``method_name`` on every rank and return the per-rank results."""
        values: list[Any] = call_raw(
            self, method_name, args, kwargs, rank_zero=False, blocking=True
        )
        return values

    def execute_rank_zero_sync(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Run ``method_name`` on rank 0 and return its result."""
        return call_raw(self, method_name, args, kwargs, rank_zero=True, blocking=True)

    def execute_all(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Same as :meth:`execute_all_async` (verl's alias): one backend handle per rank."""
        return self.execute_all_async(method_name, *args, **kwargs)

    def execute_rank_zero(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Same as :meth:`execute_rank_zero_async` (verl's alias): rank 0's backend handle."""
        return self.execute_rank_zero_async(method_name, *args, **kwargs)

    # --- binding (see _binding.py) ---------------------------------------------------------

    def _bind_worker_method(
        self, user_defined_cls: type, func_generator: Callable[..., Any] | None = None
    ) -> list[str]:
        """Bind one proxy per ``@register``-ed method of ``user_defined_cls``.

        With ``func_generator`` (verl's hook) the bound object is
        ``func_generator(self, method_name, dispatch_fn=..., collect_fn=..., execute_fn=...,
        blocking=...)`` instead of a :class:`MethodProxy`. A name already taken on the group
        is a :class:`~sc_core.MethodCollisionError`. Returns the bound names.
        """
        return bind_worker_methods(self, user_defined_cls, func_generator)

    @property
    def bound_method_names(self) -> list[str]:
        """The names of the bound worker methods, sorted."""
        return self._sc_methods.names()

    def method(self, func: RegisteredMethod[Any, Any, Q, C]) -> MethodProxy[Q, C]:
        """The bound proxy of a worker method, typed: ``wg.method(MyWorker.generate)``.

        ``func`` is a ``@register``-ed method (for the type checker a
        :class:`~sc_dispatch.RegisteredMethod`); the proxy takes the method's parameters
        (or, for per-rank modes such as ``DP_COMPUTE``, anything) and returns what the call
        collects: ``list[R]``, ``R``, or ``Any`` for non-blocking methods and modes the
        checker does not know (see :func:`sc_dispatch.register`). ``.options(...)`` keeps the
        types. A method that is not bound on this group is an
        :class:`~sc_core.UnknownMethodError`."""
        name = getattr(func, "__name__", None)
        proxy = self._sc_methods.get(name) if isinstance(name, str) else None
        if not isinstance(proxy, MethodProxy):
            raise UnknownMethodError(
                f"{type(self).__name__}.method: {func!r} is not a bound worker method; "
                f"bound: {self.bound_method_names}"
            )
        return cast("MethodProxy[Q, C]", proxy)

    def call(
        self, func: RegisteredMethod[Any, Any, Q, C], /, *args: Q.args, **kwargs: Q.kwargs
    ) -> C:
        """Call the bound worker method ``func`` with a type the checker knows, no plugin
        needed: ``wg.call(MyWorker.update_actor, batch)`` is ``wg.update_actor(batch)``.

        The arguments are checked against the worker method's parameters (except for
        per-rank modes, whose arguments are lists with one entry per rank), and the result
        is typed as the mode collects it: ``list[R]`` for ``ONE_TO_ALL``, ``R`` for
        ``DP_COMPUTE_PROTO``, ... (see :meth:`method`). ``func`` must be ``@register``-ed
        and bound on this group; for per-call options use
        ``wg.method(MyWorker.update_actor).options(timeout=30)(batch)``."""
        return self.method(func)(*args, **kwargs)

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.name_prefix!r} world_size={self.world_size} "
            f"methods={len(self._sc_methods)}>"
        )

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: typos get a list of what exists.
        bound = self.__dict__.get("_sc_methods")
        if name.startswith("__") or bound is None:
            raise AttributeError(name)
        raise UnknownMethodError(
            f"{type(self).__name__} has no attribute or bound worker method {name!r}; "
            f"bound methods: {bound.names()}"
        )

    # --- liveness (see _liveness.py) ---------------------------------------------------------

    @property
    def busy_ranks(self) -> dict[int, AbandonedCall]:
        """The ranks still running a call the group gave up on (after a deadline, a worker
        death or another rank's failure), with what they run; their next call waits."""
        backend = self._sc_runtime.backend
        is_done: Callable[[Any], bool] = (lambda _h: True) if backend is None else backend.is_done
        return self._sc_runtime.liveness.busy.current(is_done)

    @property
    def dead_ranks(self) -> list[int]:
        """Ranks known to be dead, sorted."""
        return self._sc_runtime.liveness.dead_ranks()

    def _mark_workers_dead(self, ranks: Iterable[int], reason: str = "") -> None:
        """Record dead ranks; later calls touching them raise WorkerDiedError at once."""
        self._sc_runtime.liveness.mark_dead(ranks, reason)

    def _rank_alive(self, rank: int) -> bool:
        return self._sc_backend("is_alive").is_alive(rank)

    def check_worker_aliveness(self) -> list[int]:
        """Ask the backend about every rank not yet known dead; record and return the ranks
        found dead now."""
        return self._sc_runtime.liveness.find_dead(self.world_size, self._rank_alive)

    def replace_ranks(
        self, ranks: Iterable[int] | None = None, *, timeout: float | None = None
    ) -> list[int]:
        """Put new workers in place of ``ranks`` (default: the dead ranks, the backend asked
        about every rank first) and re-form the
        group's collective state; returns the ranks replaced (sorted; ``[]`` for none).

        Each new worker gets the same rank, world size, placement and environment, except a
        new MASTER_ADDR/MASTER_PORT; then every rank runs ``Worker.on_group_reformed`` (a
        worker that uses torch.distributed tears its process groups down there), and the
        caller runs the group's set-up method (``init_model``) again. This group, its bound
        methods and the groups spawned from it keep working. ``timeout`` (default
        ``SC_CORE_WORKER_START_TIMEOUT_S``, else 300 s) bounds the new workers' start-up.
        :class:`~sc_core.BackendNotImplementedError` when the backend cannot replace workers.
        """
        return _replace.replace_ranks(self, ranks, timeout)

    def inject_fault(
        self, rank: int, method: str, *, action: FaultAction = "kill", delay_s: float = 0.0
    ) -> None:
        """Arm a fault on ``rank``: the next time it starts ``method`` (a method bound on
        this group), its process exits ``delay_s`` seconds later (``action="kill"``), or
        the method raises :class:`~sc_core.InjectedFaultError` (``action="raise"``). For
        testing recovery; see ``_faults.py``. Every rank must be alive."""
        _faults.inject_fault(self, rank, method, action, delay_s)

    # --- call ids (see _call_ids.py and _journal.py) -----------------------------------------

    def use_call_ids(self, ids: CallIds | None) -> None:
        """Give every later call of a bound method of this group (non-blocking and streamed
        calls included) an id from ``ids``, so that the workers run each id once: a driver
        that re-attaches replays calls with a newer :class:`~sc_core.CallIds` and gets the
        stored outcomes (see :class:`~sc_core.CallIds`). ``None`` turns ids off (the default).
        verl's ``execute_all_*`` and the framework's own calls never carry ids. Groups
        spawned from this one later take the same allocator; those spawned before keep
        theirs. A wrong type is a :class:`~sc_core.ConfigTypeError`."""
        if ids is not None and not isinstance(ids, CallIds):
            raise ConfigTypeError(
                f"{type(self).__name__} {self.name_prefix!r}.use_call_ids: expected a "
                f"sc_core.CallIds or None, got {type(ids).__qualname__} {ids!r}"
            )
        self._sc_call_ids = ids

    @property
    def call_ids(self) -> CallIds | None:
        """The allocator of this group's call ids (:meth:`use_call_ids`), or ``None``."""
        return self._sc_call_ids

    def _sc_journal_group(self) -> WorkerGroup[Any] | None:
        """The group whose workers keep this group's journals (a fused role's are the fused
        worker's), or ``None`` when its worker class is not an sc :class:`~sc_core.Worker`
        (which answers no journal queries)."""
        group: WorkerGroup[Any] = self
        while group._fused_role is not None and group._spawned_from is not None:
            group = group._spawned_from  # a fused role's journal is the fused worker's
        cls = _colocate.unwrap_worker_cls(group._user_defined_cls)
        return group if isinstance(cls, type) and issubclass(cls, Worker) else None

    def last_calls(self) -> list[dict[str, CallRecord]]:
        """Per rank, the last call with an id that the worker completed, per method (the
        name the worker runs: ``role_method`` on a colocated class). A worker class that is
        not an sc :class:`~sc_core.Worker` answers an empty dict. Asked on the control lane
        (a rank busy in a call answers at once)."""
        group = self._sc_journal_group()
        if group is None:
            return [{} for _ in range(self.world_size)]
        records: list[dict[str, CallRecord]] = group.execute_all_sync(LAST_CALLS_METHOD)
        return records

    def journaled_calls(self, scopes: Iterable[int] | None = None) -> list[list[JournaledCall]]:
        """Per rank, every call with an id its journal holds, of the call scopes ``scopes``
        (``None``: every scope it keeps), by scope and key: the calls still running
        (started, not finished) as well as those that returned or raised
        (:class:`~sc_core.JournaledCall`). A worker class that is not an sc
        :class:`~sc_core.Worker` answers an empty list. Asked on the control lane (a rank
        busy in a call answers at once); a dead rank is a
        :class:`~sc_core.WorkerDiedError`."""
        wanted = check_scopes(f"{type(self).__name__}.journaled_calls", scopes)
        group = self._sc_journal_group()
        if group is None:
            return [[] for _ in range(self.world_size)]
        calls: list[list[JournaledCall]] = group.execute_all_sync(JOURNAL_CALLS_METHOD, wanted)
        return calls

    def adopt_journals(self, scopes: Iterable[int]) -> list[TornCall]:
        """A re-attached driver's first question, before it replays: every live rank's
        journal of the call scopes ``scopes`` (the steps it replays). Returns the *torn*
        calls (:class:`~sc_core.TornCall`): calls that some ranks hold, running or
        finished, and other live ranks they were sent to never received (a driver killed
        while it handed the call out), each logged.

        The group (and every view over its workers) keeps what each rank held: from now
        on, a call with an id that a rank's journal held goes to that rank on the backend's
        control lane, answered from the journal (or from the running original, once it
        ends) beside whatever the rank runs; the other ranks run it. So the replay completes
        a torn call by calling it as it did before, with the same id and the arguments it
        recomputes: the ranks that never got it run it, the ranks that have it never run it
        twice, and the calls before it in the step are answered while a rank is still busy
        in it. A worker class that is not an sc :class:`~sc_core.Worker` holds nothing
        (``[]``). Asked on the control lane; a typed error for a bad ``scopes``."""
        group = self._sc_journal_group()
        if group is None:
            check_scopes(f"{type(self).__name__}.adopt_journals", scopes)
            return []
        return adopt_journals(group, scopes)

    def _sc_method_target(self, name: str) -> str | None:
        """The worker method that the method bound as ``name`` runs (``None``: none bound)."""
        proxy = self._sc_methods.get(name)
        return proxy.method_name if isinstance(proxy, MethodProxy) else None

    def kill_worker(self, rank: int) -> None:
        """Kill ``rank``'s worker now, for testing recovery (it is not restarted): the next
        call touching the rank raises :class:`~sc_core.WorkerDiedError`, until
        :meth:`replace_ranks` puts a new worker in its place. A rank outside the group is an
        :class:`~sc_core.InvalidConfigError`; a backend's group that cannot kill a worker
        raises :class:`~sc_core.BackendNotImplementedError` (``LocalWorkerGroup`` and
        ``RayWorkerGroup`` can)."""
        self._checked_rank("kill_worker", rank)
        raise BackendNotImplementedError(
            f"{type(self).__qualname__} {self.name_prefix!r}.kill_worker: this group cannot "
            f"kill a worker (rank {rank}); LocalWorkerGroup and RayWorkerGroup can"
        )

    def _checked_rank(self, method_name: str, rank: object) -> int:
        """``rank`` if it is an int rank of this group, else :class:`InvalidConfigError`."""
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world_size:
            raise InvalidConfigError(
                f"{type(self).__name__}.{method_name}: rank must be an int in "
                f"[0, {self.world_size}), got {rank!r}"
            )
        return rank

    def _block_until_all_workers_alive(self, timeout: float | None = None) -> None:
        """Wait until every worker is alive; :class:`~sc_core.WorkerDiedError` after
        ``timeout`` seconds (default ``SC_CORE_WORKER_START_TIMEOUT_S``, else 300)."""
        if timeout is None:
            timeout = WORKER_START_TIMEOUT.get()
        self._sc_runtime.liveness.wait_all_alive(self.world_size, self._rank_alive, timeout)

    def start_worker_aliveness_check(
        self, every_n_seconds: float = 1, *, abort_on_death: bool | None = None
    ) -> None:
        """Check every ``every_n_seconds`` on a daemon thread whether the workers are alive.

        A dead worker is logged and recorded: the next call touching it raises
        :class:`~sc_core.WorkerDiedError`. With ``abort_on_death=True`` (or
        ``SC_CORE_ABORT_ON_WORKER_DEATH=1``) the driver is killed with SIGABRT instead, as verl
        does. Waits first until every worker is alive.
        """
        interval = check_timeout("start_worker_aliveness_check: every_n_seconds", every_n_seconds)
        abort = ABORT_ON_WORKER_DEATH.get() if abort_on_death is None else abort_on_death
        if self._sc_runtime.liveness.monitoring:
            return
        self._block_until_all_workers_alive()
        self._sc_runtime.liveness.start_monitor(self, cast(float, interval), abort)

    def stop_worker_aliveness_check(self) -> None:
        """Stop the thread started by :meth:`start_worker_aliveness_check`."""
        self._sc_runtime.liveness.stop_monitor()

    # --- colocation (see _colocate.py and, for verl's fused classes, _fused.py) ---------------

    def _shallow_copy(self: WG) -> WG:
        """A group sharing this group's workers, with its own mesh caches and the same
        proxies rebound to it."""
        return _colocate.shallow_copy(self)

    def spawn(self: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
        """One group per role of a colocated worker class, sharing this group's workers.

        In the group of role ``r`` the role's methods (bound here as ``r_method``) are also
        bound under their plain names (``method``), as in verl. A group of a fused worker
        class (``fused_worker_used``, set by ``create_colocated_worker_cls_fused``, or a
        class made by ``create_colocated_worker_raw_cls`` and its subclasses) returns
        :meth:`spawn_fused`'s groups instead, as verl does. An unknown role is an
        :class:`~sc_core.UnknownRoleError`.
        """
        if _fused.is_fused_group(self):
            return _fused.spawn_fused(self, prefix_set)
        return _colocate.spawn(self, prefix_set)

    def spawn_fused(self: WG, prefix_set: Iterable[str]) -> dict[str, WG]:
        """One group per role of a fused worker class (``create_colocated_worker_cls_fused``
        or ``create_colocated_worker_raw_cls``, subclasses included).

        The group of role ``r`` binds the registered methods of ``r``'s own class under their
        plain names and sends every call through the fused worker's ``_fuw_execute``. A class
        that is not fused is a :class:`~sc_core.ConfigTypeError`.
        """
        return _fused.spawn_fused(self, prefix_set)

    def fuse(self, prefix_set: Iterable[str]) -> None:
        """Make each role's :meth:`spawn` group an attribute: ``wg.actor.update(...)`` (for a
        fused group, :meth:`spawn_fused`'s groups). The fused class's own registered methods
        stay bound on this group and run directly.

        A role named like an attribute of the group is a :class:`~sc_core.MethodCollisionError`.
        """
        _colocate.fuse(self, prefix_set)

    # --- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called on this group or one it shares workers with."""
        return self._sc_runtime.closed

    def close(self) -> None:
        """Stop the workers (the backend's ``close``), the aliveness thread, and release this
        group's share of its resource pool (the last group using a pool releases it). Groups
        spawned from this one share its workers and are closed with it. Later calls raise
        :class:`~sc_core.WorkerGroupClosedError`; closing again does nothing."""
        runtime = self._sc_runtime
        with runtime.lock:
            if runtime.closed:
                return
            runtime.closed = True
        try:
            self._sc_runtime.liveness.stop_monitor()
            if runtime.backend is not None:
                runtime.backend.close()
        finally:
            pool, runtime.pool = runtime.pool, None
            if pool is not None:
                pool._sc_release_user()

    def __enter__(self: WG) -> WG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
