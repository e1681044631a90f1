"""``RayWorkerGroup``: sc-core's WorkerGroup with one Ray actor per rank.

Construction places the resource pool, discovers MASTER_ADDR/MASTER_PORT on rank 0's node
(unless given), and creates every actor at once with its environment (WORLD_SIZE, RANK,
...), then waits until every constructor has finished. A call submits one actor method
per rank; large arguments (DataProtos, tensors, arrays) go into the object store once per
distinct object, in parallel, and every rank receiving the same object receives the same
reference. Blocking calls wait with ``ray.wait`` within the call's deadline and map
failures to sc-core's errors as soon as one rank fails; non-blocking calls return
:class:`~sc_ray.RayFuture` objects (joined into a DataProtoFuture by splitting modes)
without fetching anything.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import logging
import os
import threading
import time
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, cast

from sc_core import (
    Call,
    CallTimeoutError,
    ConfigTypeError,
    InvalidConfigError,
    WorkerDiedError,
    WorkerError,
    WorkerGroup,
    WorkerGroupError,
    current_call,
)
from sc_dispatch import is_future

from . import _ray_api as rapi
from ._class_with_init import RayClassWithInitArgs, merge_options
from ._errors import DetachedWorkerError, RayResourcePoolError, WorkerEnvError
from ._futures import Deadline, RayFuture, await_with_deadline, row_meta
from ._nbytes import estimate_nbytes, is_bulk
from ._resource_pool import BundleSlot, RayResourcePool
from ._wire import ensure_tensordict_wire, is_tensordict

__all__ = ["RESERVED_ENV_VARS", "RayWorkerGroup"]

logger = logging.getLogger("sc_ray")

if TYPE_CHECKING:
    # The worker class, for the type checker only (sc-core's typed calls and mypy plugin);
    # it defaults to ``Any`` (PEP 696), so a bare ``RayWorkerGroup`` stays valid.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    W = _TypeVarWithDefault("W", default=Any)
else:
    W = TypeVar("W")
_RWG = TypeVar("_RWG", bound="RayWorkerGroup")

#: Variables the worker group sets for every actor; ``worker_env`` may not set them.
RESERVED_ENV_VARS = (
    "WORLD_SIZE",
    "RANK",
    "LOCAL_WORLD_SIZE",
    "LOCAL_RANK",
    "WG_PREFIX",
    "WG_BACKEND",
    "RAY_LOCAL_WORLD_SIZE",
    "RAY_LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    # A rendezvous factory imported and called in every worker: code from the environment,
    # so users may not set it through worker_env / runtime_env (a backend sets it itself).
    "SC_RENDEZVOUS",
)

#: How often a blocking wait looks at the ranks that already answered (seconds): a failed
#: or dead rank is reported within this long even while other ranks keep running.
_POLL_S = 0.25

CALL_METHOD = "_sc_call"
META_METHOD = "_sc_call_with_meta"
ENV_KWARG = "_sc_env"


def _worker_error(instance: Any, name: str, exc: Exception) -> WorkerError:
    """The error a worker raises for a method that raised ``exc``: names the method and the
    rank, and is an instance of ``type(exc)`` too (see :class:`sc_core.WorkerError`)."""
    rank = instance.__dict__.get("_rank")
    if not isinstance(rank, int):
        raw = os.environ.get("RANK", "")
        rank = int(raw) if raw.isdigit() else -1
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb  # skip the wrapper
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return WorkerError.from_exception(name, rank, exc, remote_traceback=text)


class _Lifecycle:
    """Shared by a group and the groups spawned from it."""

    def __init__(self) -> None:
        self.closed = False
        self.lock = threading.Lock()


def _actor_class(cls: type) -> type:
    """The class sc-ray runs as an actor: ``cls`` plus

    * a constructor keyword ``_sc_env`` whose variables go into ``os.environ`` before the
      worker's own constructor runs (cheaper than a Ray ``runtime_env`` per rank, which
      would start a fresh worker process per distinct environment);
    * ``_sc_call(name, ...)``, which runs any method and turns an exception into a
      :class:`~sc_core.WorkerError` naming the method and the rank (and still an instance of
      the original exception's class), so that ``ray.get`` on a call's references raises it
      too; every call of the group goes through it;
    * ``_sc_call_with_meta``, the same returning ``(row_count, value)``, so that a
      non-blocking call of a splitting mode knows its shards' row counts without fetching
      them. Both are ``async`` only if the class already has ``async`` methods (Ray then runs
      the actor as an async actor anyway).
    """
    roles: Mapping[str, type] = getattr(cls, "raw_cls_dict", None) or {}
    has_async = any(
        inspect.iscoroutinefunction(getattr(klass, name, None))
        for klass in (cls, *roles.values())
        for name in dir(klass)
        if not name.startswith("__")
    )
    namespace: dict[str, Any] = {}
    if has_async and getattr(cls, "is_fused_worker", False):
        # A fused worker's _fuw_execute is plain; make it await async role methods.
        fused_execute = cast(Any, cls)._fuw_execute

        async def _fuw_execute(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
            out = fused_execute(self, method_name, *args, **kwargs)
            if inspect.isawaitable(out):
                out = await out
            return out

        namespace["_fuw_execute"] = _fuw_execute
    if has_async:

        async def call_async(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                out = getattr(self, name)(*args, **kwargs)
                if inspect.isawaitable(out):
                    out = await out
            except Exception as exc:
                raise _worker_error(self, name, exc) from exc
            if is_tensordict(out):
                ensure_tensordict_wire()
            return out

        async def call_with_meta_async(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            out = await call_async(self, name, *args, **kwargs)
            return row_meta(out), out

        call: Any = call_async
        method: Any = call_with_meta_async
    else:

        def call_sync(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            try:
                out = getattr(self, name)(*args, **kwargs)
            except Exception as exc:
                raise _worker_error(self, name, exc) from exc
            if is_tensordict(out):
                ensure_tensordict_wire()
            return out

        def call_with_meta_sync(self: Any, name: str, *args: Any, **kwargs: Any) -> Any:
            out = call_sync(self, name, *args, **kwargs)
            return row_meta(out), out

        call = call_sync
        method = call_with_meta_sync
    call.__name__ = CALL_METHOD
    method.__name__ = META_METHOD

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        env = kwargs.pop(ENV_KWARG, None)
        if env:
            os.environ.update(env)
        cast(Any, cls).__init__(self, *args, **kwargs)

    namespace.update(
        {
            CALL_METHOD: call,
            META_METHOD: method,
            "_sc_framework_class": True,
            "__init__": __init__,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
        }
    )
    sub = type(cls.__name__, (cls,), namespace)
    sub.__qualname__ = cls.__qualname__
    return sub


def _start_timeout(given: float | None, fallback: float) -> float:
    if given is not None:
        value: float | None = float(given)
    else:
        raw = os.environ.get("SC_WORKER_START_TIMEOUT", "").strip()
        try:
            value = float(raw) if raw else float(fallback)
        except ValueError:
            raise InvalidConfigError(
                f"SC_WORKER_START_TIMEOUT must be a number of seconds, got {raw!r}"
            ) from None
    if value is None or not value > 0:
        raise InvalidConfigError(f"RayWorkerGroup: start_timeout must be positive, got {value!r}")
    return value


class RayWorkerGroup(WorkerGroup[W]):
    """A group of Ray actors, one per rank of ``resource_pool``, running ``ray_cls_with_init``.

    Every ``@register``-ed method of the worker class becomes a method of the group. Each
    actor's environment has WORLD_SIZE, RANK, LOCAL_WORLD_SIZE, LOCAL_RANK, WG_PREFIX,
    WG_BACKEND (``ray``), RAY_LOCAL_WORLD_SIZE, RAY_LOCAL_RANK, MASTER_ADDR and MASTER_PORT
    (rank 0's node and a free port there, unless ``master_addr``/``master_port`` are given);
    ``worker_env`` adds variables and may not override those (:class:`WorkerEnvError`).

    ``bin_pack=True`` packs each node's bundles strictly (``STRICT_PACK``), else ``PACK``.
    ``detached=True`` creates named actors that outlive this driver
    (:meth:`from_detached` attaches to them). ``start_timeout`` (default
    ``SC_WORKER_START_TIMEOUT`` or 300 s) bounds the wait for the constructors. Use the group
    as a context manager, or call :meth:`shutdown`, to kill the actors and release the pool's
    placement groups.
    """

    def __init__(
        self,
        resource_pool: RayResourcePool | None = None,
        ray_cls_with_init: RayClassWithInitArgs[W] | None = None,
        bin_pack: bool = True,
        name_prefix: str | None = None,
        detached: bool = False,
        worker_names: Sequence[str] | None = None,
        worker_handles: Sequence[rapi.ActorHandle] | None = None,
        ray_wait_register_center_timeout: float = 300,
        *,
        worker_env: Mapping[str, str] | None = None,
        master_addr: str | None = None,
        master_port: int | str | None = None,
        device_name: str | None = None,
        default_timeout: float | None = None,
        start_timeout: float | None = None,
    ) -> None:
        super().__init__(resource_pool, name_prefix=name_prefix, default_timeout=default_timeout)
        if ray_cls_with_init is not None and not isinstance(
            ray_cls_with_init, RayClassWithInitArgs
        ):
            raise ConfigTypeError(
                f"RayWorkerGroup: ray_cls_with_init must be a RayClassWithInitArgs, got "
                f"{type(ray_cls_with_init).__qualname__}"
            )
        self.ray_cls_with_init = ray_cls_with_init
        self._detached = bool(detached)
        self._bin_pack = bool(bin_pack)
        self._lifecycle = _Lifecycle()
        self._meta_refs: dict[int, rapi.ObjectRef] = {}
        self._meta_lock = threading.Lock()
        self._pool_user = False
        self._start_timeout = _start_timeout(start_timeout, ray_wait_register_center_timeout)
        self.device_name = device_name or (
            resource_pool.device_name if isinstance(resource_pool, RayResourcePool) else "cuda"
        )
        self._worker_env = self._check_worker_env(worker_env)
        if (master_addr is None) != (master_port is None):
            given, missing = (
                ("master_addr", "master_port")
                if master_port is None
                else ("master_port", "master_addr")
            )
            raise InvalidConfigError(
                f"RayWorkerGroup: {given} was given without {missing}; give both to choose the "
                "rendezvous address, or neither to let rank 0's node pick one"
            )
        self.sub_cls_name = ""
        if resource_pool is None:
            self._init_with_detached_workers(worker_names, worker_handles)
        else:
            if not isinstance(resource_pool, RayResourcePool):
                raise ConfigTypeError(
                    f"RayWorkerGroup: resource_pool must be a RayResourcePool, got "
                    f"{type(resource_pool).__qualname__}"
                )
            if ray_cls_with_init is None:
                raise InvalidConfigError(
                    "RayWorkerGroup: a resource_pool needs ray_cls_with_init (the worker class)"
                )
            self._init_with_resource_pool(
                resource_pool, ray_cls_with_init, master_addr, master_port
            )
        if ray_cls_with_init is not None:
            self._bind_worker_method(ray_cls_with_init.worker_cls)

    # --- construction ------------------------------------------------------------------

    @staticmethod
    def _check_worker_env(worker_env: Mapping[str, str] | None) -> dict[str, str]:
        if worker_env is None:
            return {}
        if not isinstance(worker_env, Mapping):
            raise WorkerEnvError(
                f"RayWorkerGroup: worker_env must be a mapping of str to str, got "
                f"{type(worker_env).__qualname__}"
            )
        bad = sorted(k for k in worker_env if k in RESERVED_ENV_VARS)
        if bad:
            raise WorkerEnvError(
                f"RayWorkerGroup: worker_env sets {bad}, which the worker group sets for each "
                f"worker ({', '.join(RESERVED_ENV_VARS)}); pass master_addr/master_port to "
                "choose the rendezvous address"
            )
        wrong = {
            k: v for k, v in worker_env.items() if not isinstance(k, str) or not isinstance(v, str)
        }
        if wrong:
            raise WorkerEnvError(f"RayWorkerGroup: worker_env values must be str, got {wrong!r}")
        return dict(worker_env)

    def _discover_master(
        self, slot: BundleSlot, master_addr: str | None, master_port: int | str | None
    ) -> tuple[str, str]:
        node_id = rapi.placement_group_bundle_nodes(slot.placement_group)[slot.bundle_index]
        if master_addr is None:
            nodes = {n.node_id: n for n in rapi.list_nodes()}
            node = nodes.get(node_id)
            master_addr = node.ip if node is not None else rapi.node_ip_address()
        if master_port is None:
            if node_id == rapi.current_node_id():
                master_port = rapi.find_free_port()
            else:
                ref = rapi.run_task(
                    rapi.find_free_port,
                    {"num_cpus": 0, "scheduling_strategy": rapi.node_affinity(node_id)},
                )
                master_port = int(rapi.get([ref], timeout_s=self._start_timeout)[0])
        return str(master_addr), str(master_port)

    def _remote_cls(self, ray_cls_with_init: RayClassWithInitArgs) -> rapi.RemoteClass:
        base = ray_cls_with_init.worker_cls
        decorated = rapi.remote_class_options(ray_cls_with_init.cls)
        cls = rapi.remote_class(_actor_class(base))
        if decorated:
            ray_cls_with_init._options = merge_options(decorated, ray_cls_with_init._options)
        return cls

    def _init_with_resource_pool(
        self,
        pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs,
        master_addr: str | None,
        master_port: int | str | None,
    ) -> None:
        strategy = "STRICT_PACK" if self._bin_pack else "PACK"
        pool.get_placement_groups(strategy=strategy, device_name=self.device_name)
        pool._sc_acquire()
        self._pool_user = True
        try:
            slots = pool.bundle_slots()
            self._master_addr, self._master_port = self._discover_master(
                slots[0], master_addr, master_port
            )
            class_name = ray_cls_with_init.worker_cls.__name__
            remote_cls = self._remote_cls(ray_cls_with_init)
            self._check_fits(pool, ray_cls_with_init)
            user_env = (ray_cls_with_init._options.get("runtime_env") or {}).get("env_vars") or {}
            clash = sorted(k for k in user_env if k in RESERVED_ENV_VARS)
            if clash:
                raise WorkerEnvError(
                    f"RayWorkerGroup: the runtime_env of {class_name} sets {clash}, which the "
                    f"worker group sets for each worker ({', '.join(RESERVED_ENV_VARS)})"
                )
            share = pool.actor_resources()
            self.sub_cls_name = class_name
            world = len(slots)
            lifetime = "detached" if self._detached else None
            for rank, slot in enumerate(slots):
                env = {
                    "WORLD_SIZE": str(world),
                    "RANK": str(rank),
                    "LOCAL_WORLD_SIZE": str(slot.local_world_size),
                    "LOCAL_RANK": str(slot.local_rank),
                    "WG_PREFIX": self.name_prefix,
                    "WG_BACKEND": "ray",
                    "RAY_LOCAL_WORLD_SIZE": str(slot.local_world_size),
                    "RAY_LOCAL_RANK": str(slot.local_rank),
                    "MASTER_ADDR": self._master_addr,
                    "MASTER_PORT": self._master_port,
                    **self._worker_env,
                }
                name = f"{self.name_prefix}{class_name}_{slot.node_index}:{slot.local_rank}"
                options = ray_cls_with_init.actor_options(
                    slot.placement_group,
                    slot.bundle_index,
                    use_gpu=pool.use_gpu,
                    num_gpus=share.get("num_gpus", share.get(pool.device_resource, 0.0)),
                    device_name=pool.device_name,
                    num_cpus=share["num_cpus"],
                    name=name,
                    lifetime=lifetime,
                )
                kwargs = {**ray_cls_with_init.kwargs, ENV_KWARG: env}
                handle = rapi.create_actor(remote_cls, options, ray_cls_with_init.args, kwargs)
                self._workers.append(handle)
                self._worker_names.append(name)
            self._await_started()
        except BaseException:
            self._teardown()
            raise

    def _check_fits(self, pool: RayResourcePool, cls: RayClassWithInitArgs) -> None:
        bundle = pool.bundle()
        asked = {
            "CPU": cls._options.get("num_cpus"),
            "GPU": cls._options.get("num_gpus"),
        }
        for key, value in asked.items():
            if value is None:
                continue
            have = bundle.get(key, 0.0)
            if float(value) > have:
                raise RayResourcePoolError(
                    f"RayWorkerGroup: {cls.worker_cls.__qualname__} asks {key}={value} per "
                    f"actor, but each bundle of pool {pool.store} holds {have:g} "
                    f"(bundle {bundle}); lower the option or raise num_cpus_per_process"
                )

    def _await_started(self) -> None:
        refs = [rapi.ready_ref(w) for w in self._workers]
        ranks = tuple(range(len(refs)))
        deadline = rapi.monotonic() + float(self._start_timeout)
        self._wait_refs(refs, ranks, "__init__", deadline, float(self._start_timeout), None)

    def _init_with_detached_workers(
        self,
        worker_names: Sequence[str] | None,
        worker_handles: Sequence[rapi.ActorHandle] | None,
    ) -> None:
        if worker_handles is not None:
            handles = list(worker_handles)
            names = list(worker_names) if worker_names is not None else [""] * len(handles)
        elif worker_names is not None:
            names = list(worker_names)
            handles = []
            for name in names:
                try:
                    handles.append(rapi.get_actor(name))
                except ValueError:
                    raise DetachedWorkerError(
                        f"RayWorkerGroup.from_detached: no actor named {name!r} in this Ray "
                        "namespace (detached workers are found by name in the namespace of "
                        "the driver that created them: ray.init(namespace=...))"
                    ) from None
        else:
            raise InvalidConfigError(
                "RayWorkerGroup: without a resource_pool give worker_names or worker_handles"
            )
        if len(names) != len(handles):
            raise InvalidConfigError(
                f"RayWorkerGroup: {len(names)} worker_names for {len(handles)} worker_handles"
            )
        self._workers = handles
        self._worker_names = names

    @classmethod
    def from_detached(
        cls,
        name_prefix: str | None = None,
        worker_names: Sequence[str] | None = None,
        worker_handles: Sequence[rapi.ActorHandle] | None = None,
        ray_cls_with_init: RayClassWithInitArgs | None = None,
        **kwargs: Any,
    ) -> RayWorkerGroup:
        """A group over existing (detached) actors, found by name or given as handles."""
        return cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            **kwargs,
        )

    # --- verl's accessors ----------------------------------------------------------------

    @property
    def worker_names(self) -> list[str]:
        """The Ray actor names of the workers, in rank order."""
        return list(self._worker_names)

    @property
    def master_address(self) -> str | None:
        return self._master_addr

    @property
    def master_port(self) -> str | None:
        return self._master_port

    def alive_ranks(self) -> list[int]:
        """The ranks whose actors are alive now (asks the cluster)."""
        self.check_worker_aliveness()
        dead = set(self.dead_ranks)
        return [r for r in range(self.world_size) if r not in dead]

    # --- the backend hooks -----------------------------------------------------------------

    def _require_open(self, method_name: str) -> None:
        if self._lifecycle.closed:
            raise WorkerGroupError(
                f"RayWorkerGroup {self.name_prefix}.{method_name}: the group was shut down"
            )
        self._require_workers(method_name)

    def _put_shared(
        self, per_rank: list[tuple[tuple[Any, ...], dict[str, Any]]]
    ) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
        """Put each distinct bulk argument into the object store once (in parallel) and
        give every rank that receives it the same reference."""
        distinct: dict[int, Any] = {}
        for args, kwargs in per_rank:
            for value in (*args, *kwargs.values()):
                if id(value) not in distinct and not is_future(value) and is_bulk(value):
                    distinct[id(value)] = value
        if not distinct:
            return per_rank
        items = list(distinct.items())
        if any(is_tensordict(v) for _, v in items):
            ensure_tensordict_wire()
        if len(items) == 1:
            refs = [rapi.put(items[0][1])]
        else:
            with concurrent.futures.ThreadPoolExecutor(min(8, len(items))) as pool:
                refs = list(pool.map(rapi.put, [v for _, v in items]))
        by_id = {key: ref for (key, _), ref in zip(items, refs, strict=True)}
        call = current_call()
        if call is not None:
            call.span.add_bytes(put=sum(estimate_nbytes(v) for _, v in items))
        return [
            (
                tuple(by_id.get(id(a), a) for a in args),
                {k: by_id.get(id(v), v) for k, v in kwargs.items()},
            )
            for args, kwargs in per_rank
        ]

    def _submit(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> rapi.ObjectRef:
        """Start the method on one rank; returns the reference of its value (as verl does).
        For a non-blocking call of a splitting mode the worker also returns the value's row
        count, whose reference waits in ``_meta_refs`` for :meth:`_pending_outputs`."""
        call = current_call()
        worker = self._workers[rank]
        if call is not None and not call.blocking and call.joins_shards:
            meta, value = rapi.call_actor_multi(
                worker, META_METHOD, (method_name, *args), kwargs, 2
            )
            with self._meta_lock:
                self._meta_refs[id(value)] = meta
            return value
        return rapi.call_actor(worker, CALL_METHOD, (method_name, *args), kwargs)

    def _execute_rank_async(
        self, rank: int, method_name: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> rapi.ObjectRef:
        self._require_open(method_name)
        ((args, kwargs),) = self._put_shared([(args, kwargs)])
        return self._submit(rank, method_name, args, kwargs)

    def execute_all_async(self, method_name: str, *args: Any, **kwargs: Any) -> list[Any]:
        """Start ``method_name`` on every rank; returns one handle per rank. Bulk arguments
        go into the object store once each, whichever ranks receive them."""
        self._require_open(method_name)
        per_rank = self._put_shared(self._per_rank_arguments(args, kwargs))
        return [self._submit(r, method_name, a, k) for r, (a, k) in enumerate(per_rank)]

    def execute_rank_zero_async(self, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """Start ``method_name`` on rank 0 only; returns its handle."""
        return self._execute_rank_async(0, method_name, args, kwargs)

    def _wait(self, handles: Sequence[Any], call: Call) -> list[Any]:
        refs = list(handles)
        return self._wait_refs(
            refs, call.ranks, call.method_name, call.deadline, call.timeout, call
        )

    def _wait_refs(
        self,
        refs: Sequence[rapi.ObjectRef],
        ranks: Sequence[int],
        method: str,
        deadline: float | None,
        timeout: float | None,
        call: Call | None,
    ) -> list[Any]:
        """The values of ``refs`` (one per rank in ``ranks``); raises as soon as a rank
        fails, or when the deadline passes."""
        start = time.time()
        pending: dict[int, rapi.ObjectRef] = dict(enumerate(refs))
        values: list[Any] = [None] * len(refs)
        while pending:
            remaining = None if deadline is None else max(0.0, deadline - rapi.monotonic())
            slice_s = _POLL_S if remaining is None else min(_POLL_S, remaining)
            ready, _ = rapi.wait(list(pending.values()), len(pending), slice_s)
            if ready:
                ready_ids = {id(r) for r in ready}
                done = [i for i, r in pending.items() if id(r) in ready_ids]
                self._collect(done, pending, values, ranks, method, call, start)
            elif remaining is not None and remaining <= 0:
                waiting = [ranks[i] for i in sorted(pending)]
                raise CallTimeoutError(method, waiting, timeout)
        return values

    def _collect(
        self,
        done: list[int],
        pending: dict[int, rapi.ObjectRef],
        values: list[Any],
        ranks: Sequence[int],
        method: str,
        call: Call | None,
        start: float,
    ) -> None:
        refs = [pending[i] for i in done]
        try:
            got = rapi.get(refs)
        except Exception:
            got = None
        if got is not None:
            now = time.time()
            for i, value in zip(done, got, strict=True):
                values[i] = value
                del pending[i]
                if call is not None:
                    call.span.add_phase("execute", start, now, ranks[i])
            if call is not None:
                call.span.add_bytes(fetched=sum(estimate_nbytes(v) for v in got))
            return
        failures: dict[int, rapi.RemoteFailure] = {}
        for i in done:
            try:
                values[i] = rapi.get([pending[i]])[0]
            except Exception as exc:
                failures[ranks[i]] = rapi.classify_failure(exc)
            del pending[i]
        self._raise_failures(failures, method)

    def _raise_failures(self, failures: Mapping[int, rapi.RemoteFailure], method: str) -> None:
        died = sorted(r for r, f in failures.items() if f.kind == "died")
        if died:
            reason = failures[died[0]].cause_type
            self._mark_workers_dead(died, f"{reason} during {method}")
            raise WorkerDiedError(method, died, reason) from failures[died[0]].cause
        first = min(failures)
        failure = failures[first]
        others = sorted(r for r in failures if r != first)
        if isinstance(failure.cause, WorkerError):  # raised by the worker's _sc_call
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

    def _pending_outputs(self, handles: Sequence[Any], call: Call) -> list[Any]:
        """Non-blocking calls return Ray object references, as in verl; splitting modes get
        futures that also know their row counts (joined into a DataProtoFuture).

        A call with a deadline keeps it however its result is consumed: the futures' ``get``
        (also inside a consumer worker) raises ``CallTimeoutError`` once it has passed, and
        the references of the other modes are those of small tasks that wait for the value
        until the deadline, so that ``ray.get`` raises it too."""
        remaining = call.remaining()
        deadline = (
            None
            if remaining is None or call.timeout is None
            else Deadline(time.time() + remaining, call.timeout, call.method_name, call.ranks)
        )
        if not call.joins_shards:
            if deadline is None:
                return list(handles)
            return [
                rapi.run_task(
                    await_with_deadline,
                    {"num_cpus": 0, "max_retries": 0},
                    ([handle], deadline, rank),
                )
                for rank, handle in zip(call.ranks, handles, strict=True)
            ]
        with self._meta_lock:
            metas = [self._meta_refs.pop(id(h), None) for h in handles]
        return [
            RayFuture(handle, meta, call.method_name, rank, deadline)
            for rank, handle, meta in zip(call.ranks, handles, metas, strict=True)
        ]

    def _handle_done(self, handle: Any) -> bool:
        return not rapi.is_object_ref(handle) or rapi.is_ready(handle)

    def _cancel_handle(self, handle: Any) -> bool:
        return rapi.is_object_ref(handle) and rapi.cancel(handle)

    def _is_worker_alive(self, worker: Any) -> bool:
        return rapi.actor_state(worker) != "DEAD"

    # --- lifecycle --------------------------------------------------------------------------

    def _teardown(self, release_pool: bool = True) -> None:
        # A group attached with from_detached has no pool object: the placement groups its
        # actors run in are found through the actors, before they are killed.
        attached_pgs: dict[str, rapi.PlacementGroup] = {}
        if release_pool and self._resource_pool is None:
            for worker in self._workers:
                try:
                    pg = rapi.actor_placement_group(worker, timeout_s=self._start_timeout)
                except Exception:  # a dead actor has nothing to ask; its group may still
                    continue
                if pg is not None:
                    attached_pgs[rapi.placement_group_id(pg)] = pg
        for worker in self._workers:
            rapi.kill(worker)
        for pg in attached_pgs.values():
            rapi.remove_placement_group(pg)
            logger.info(
                "released placement group %s of an attached group", rapi.placement_group_id(pg)
            )
        pool = self._resource_pool
        if self._pool_user and isinstance(pool, RayResourcePool):
            self._pool_user = False
            pool._sc_release_user()

    def shutdown(self, release_pool: bool = True) -> None:
        """Kill every actor of the group (detached ones too) and, when no other group uses
        it, release the pool's placement groups. A group attached with
        :meth:`from_detached` releases the placement groups its actors ran in (found
        through the actors), so their resources come back and the pool's name can be used
        again; ``release_pool=False`` keeps them (other groups placed in the same pool would
        be killed with it). Later calls raise ``WorkerGroupError``; calling it again does
        nothing. Groups spawned from this one share its actors."""
        with self._lifecycle.lock:
            already = self._lifecycle.closed
            self._lifecycle.closed = True
        if not already:
            self.stop_worker_aliveness_check()
        # Killing is idempotent; the group that placed the pool releases its share of it.
        self._teardown(release_pool and not already)

    @property
    def closed(self) -> bool:
        """Whether :meth:`shutdown` was called (on this group or one it shares actors with)."""
        return self._lifecycle.closed

    def __enter__(self: _RWG) -> _RWG:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def _shallow_copy(self) -> RayWorkerGroup:
        new = super()._shallow_copy()
        new._pool_user = False  # the original group releases the pool
        return new

    def __deepcopy__(self, memo: dict[int, Any]) -> RayWorkerGroup:
        raise WorkerGroupError("a RayWorkerGroup cannot be deep-copied; use spawn()")

    def __repr__(self) -> str:
        state = "closed" if self._lifecycle.closed else f"world_size={self.world_size}"
        return f"RayWorkerGroup({self.name_prefix!r}, {self.sub_cls_name or '?'}, {state})"
