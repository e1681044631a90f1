"""``RayWorkerGroup``: sc-core's WorkerGroup with one Ray actor per rank.

Construction places the resource pool, discovers MASTER_ADDR/MASTER_PORT on rank 0's node
(unless given), creates every actor at once with its environment (``_actor_launch.py``) and
waits until every constructor has finished; the group then holds a
:class:`~sc_ray._ray_backend.RayBackend` that runs its calls. Non-blocking calls return
:class:`~sc_ray.RayFuture` objects (joined into a DataProtoFuture by splitting modes) or Ray
references, without fetching anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from sc_core import ConfigTypeError, InvalidConfigError, WorkerGroup, WorkerGroupError

from . import _ray_api as rapi
from ._actor_class import actor_class, twin_names
from ._actor_launch import (
    RESERVED_ENV_VARS,
    LaunchSpec,
    check_worker_env,
    launch_actors,
    resolve_start_timeout,
)
from ._class_with_init import RayClassWithInitArgs
from ._errors import DetachedWorkerError
from ._ray_backend import RayBackend, wait_refs
from ._resource_pool import RayResourcePool, check_device_name
from ._standby import AdoptedSpare, Standby

__all__ = ["RESERVED_ENV_VARS", "RayWorkerGroup"]

logger = logging.getLogger(__name__)

#: How long :meth:`RayWorkerGroup.kill_worker` waits for the cluster to report the actor dead.
KILL_WAIT_S = 30.0

if TYPE_CHECKING:
    # The worker class, for the type checker only (sc-core's typed calls and mypy plugin);
    # it defaults to ``Any`` (PEP 696), so a bare ``RayWorkerGroup`` stays valid.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    W = _TypeVarWithDefault("W", default=Any)
else:
    W = TypeVar("W")


class RayWorkerGroup(WorkerGroup[W]):
    """A group of Ray actors, one per rank of ``resource_pool``, running ``ray_cls_with_init``.

    Every ``@register``-ed method of the worker class becomes a method of the group. Each
    actor's environment has WORLD_SIZE, RANK, LOCAL_WORLD_SIZE, LOCAL_RANK, WG_PREFIX,
    WG_BACKEND (``ray``), RAY_LOCAL_WORLD_SIZE, RAY_LOCAL_RANK, MASTER_ADDR and MASTER_PORT
    (rank 0's node and a free port there, unless ``master_addr``/``master_port`` are given);
    ``worker_env`` adds variables and may not override those (:class:`WorkerEnvError`).

    ``bin_pack=True`` packs each node's bundles strictly (``STRICT_PACK``), else ``PACK``.
    ``detached=True`` creates named actors that outlive this driver
    (:meth:`from_detached` attaches to them); they have a control lane (a Ray concurrency
    group of their own) where the framework's queries and the calls answered from their
    journals run beside their running call, and their methods run on a thread of the
    default group, not the main thread. ``start_timeout`` (default
    ``SC_RAY_WORKER_START_TIMEOUT_S`` or 300 s) bounds the wait for the constructors. Use the group
    as a context manager, or call :meth:`close` (verl's :meth:`shutdown`), to kill the actors;
    the pool's placement groups are released with the last group that uses the pool.

    ``device_name`` (default: the pool's) names the accelerator: ``"cuda"``, ``"npu"``, or
    ``"cpu"`` for a pool with ``use_gpu=False`` (:class:`RayResourcePoolError` for a GPU pool
    or an unknown name). The group copies ``ray_cls_with_init.fused_worker_used`` (verl's
    flag, set by :func:`create_colocated_worker_cls_fused`): :meth:`spawn` and :meth:`fuse` of
    a fused group give one fused group per role.

    ``standby=N`` keeps N spare actors (imports done, no worker built, no resources
    reserved) on the pool's nodes: :meth:`replace_ranks` turns one into the dead rank
    without a process start-up, and starts a new spare in the background (``_standby.py``).
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
        standby: int = 0,
    ) -> None:
        super().__init__(resource_pool, name_prefix=name_prefix, default_timeout=default_timeout)
        if isinstance(standby, bool) or not isinstance(standby, int) or standby < 0:
            raise InvalidConfigError(
                f"RayWorkerGroup: standby must be an int >= 0, got {standby!r}"
            )
        if standby and resource_pool is None:
            raise InvalidConfigError(
                "RayWorkerGroup: standby needs a resource_pool to start spare actors in; a "
                "group attached to detached actors has none"
            )
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
        self._start_timeout = resolve_start_timeout(start_timeout, ray_wait_register_center_timeout)
        pool_gpu = isinstance(resource_pool, RayResourcePool) and resource_pool.use_gpu
        if device_name is None:
            device_name = (
                resource_pool.device_name if isinstance(resource_pool, RayResourcePool) else "cuda"
            )
        self.device_name = check_device_name("RayWorkerGroup", device_name, pool_gpu)
        # verl's flag: a group of create_colocated_worker_cls_fused's class spawns fused groups.
        fused = False if ray_cls_with_init is None else ray_cls_with_init.fused_worker_used
        if not isinstance(fused, bool):
            raise ConfigTypeError(
                f"RayWorkerGroup: fused_worker_used of {ray_cls_with_init!r} must be a bool, "
                f"got {type(fused).__qualname__} {fused!r}"
            )
        self.fused_worker_used = fused
        self._worker_env = check_worker_env(worker_env)
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
        self._launch: LaunchSpec | None = None
        self._standby: Standby | None = None
        actor_cls = None if ray_cls_with_init is None else actor_class(ray_cls_with_init.worker_cls)
        if resource_pool is None:
            self._init_with_detached_workers(worker_names, worker_handles)
        else:
            if not isinstance(resource_pool, RayResourcePool):
                raise ConfigTypeError(
                    f"RayWorkerGroup: resource_pool must be a RayResourcePool, got "
                    f"{type(resource_pool).__qualname__}"
                )
            if ray_cls_with_init is None or actor_cls is None:
                raise InvalidConfigError(
                    "RayWorkerGroup: a resource_pool needs ray_cls_with_init (the worker class)"
                )
            self._init_with_resource_pool(
                resource_pool, ray_cls_with_init, actor_cls, master_addr, master_port, standby
            )
        backend = RayBackend(
            self.name_prefix,
            self._workers,
            frozenset() if actor_cls is None else twin_names(actor_cls),
            release_attached_pgs=resource_pool is None,
            probe_timeout=self._start_timeout,
            launch=self._launch,
            names=self._worker_names,
            control_lane=self._detached,
        )
        self._ray = backend
        backend.standby = self._standby
        self._attach_backend(backend, pool_acquired=True)
        if ray_cls_with_init is not None:
            self._bind_worker_method(ray_cls_with_init.worker_cls)

    # --- construction ------------------------------------------------------------------

    def _init_with_resource_pool(
        self,
        pool: RayResourcePool,
        cia: RayClassWithInitArgs,
        actor_cls: type,
        master_addr: str | None,
        master_port: int | str | None,
        standby: int,
    ) -> None:
        strategy = "STRICT_PACK" if self._bin_pack else "PACK"
        pool.get_placement_groups(strategy=strategy, device_name=self.device_name)
        pool._sc_acquire()
        created: list[rapi.ActorHandle] = []
        spec = LaunchSpec(
            pool,
            cia,
            actor_cls,
            name_prefix=self.name_prefix,
            worker_env=self._worker_env,
            master_addr=master_addr,
            master_port=master_port,
            detached=self._detached,
        )
        try:
            launched = launch_actors(spec, timeout=self._start_timeout, created=created)
            self.sub_cls_name = cia.worker_cls.__name__
            self._workers = launched.workers
            self._worker_names = launched.names
            self._master_addr, self._master_port = launched.master_addr, launched.master_port
            self._launch = spec
            refs = [rapi.ready_ref(w) for w in self._workers]
            deadline = rapi.monotonic() + self._start_timeout
            ranks = tuple(range(len(refs)))
            wait_refs(refs, ranks, "__init__", deadline, self._start_timeout, None)
            if standby:
                self._standby = Standby(spec, standby, self._workers)
        except BaseException:
            for worker in created:
                rapi.kill(worker)
            pool._sc_release_user()
            raise
        self._sc_runtime.pool = pool

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

    @classmethod
    def _sc_reattach(
        cls,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs[W],
        name_prefix: str,
        workers: Sequence[rapi.ActorHandle | None],
        worker_names: Sequence[str],
        master: tuple[str | None, str | None],
        generation: int,
        *,
        adopted_spares: Sequence[AdoptedSpare] = (),
        standby_started: int = 0,
        standby_devices: Sequence[str | None] | None = None,
        **kwargs: Any,
    ) -> RayWorkerGroup[W]:
        """A group over a run's live actors (``_run.py``): no actor is created or
        re-initialised, the ranks whose actor is ``None`` are marked dead, and
        :meth:`replace_ranks` starts new (detached) actors on ``resource_pool`` as the group
        that created the run's actors would. With ``standby=N`` in ``kwargs`` the group
        keeps the previous driver's live spares (``adopted_spares``; see
        :class:`~sc_ray._standby.Standby` for ``standby_started`` and ``standby_devices``)
        and starts only the missing ones. ``kwargs`` are the constructor's."""
        standby = kwargs.pop("standby", 0)
        handles = [
            w if w is not None else rapi.gone_actor(n)
            for w, n in zip(workers, worker_names, strict=True)
        ]
        group = cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            detached=True,
            worker_names=worker_names,
            worker_handles=handles,
            **kwargs,
        )
        spec = LaunchSpec(
            resource_pool,
            ray_cls_with_init,
            actor_class(ray_cls_with_init.worker_cls),
            name_prefix=group.name_prefix,
            worker_env=group._worker_env,
            master_addr=kwargs.get("master_addr"),
            master_port=kwargs.get("master_port"),
            detached=True,
        )
        group._launch = spec
        group._ray.resume(spec, generation)
        group.sub_cls_name = ray_cls_with_init.worker_cls.__name__
        group._master_addr, group._master_port = master
        resource_pool._sc_acquire()
        group._sc_runtime.pool = resource_pool
        dead = [rank for rank, worker in enumerate(workers) if worker is None]
        if dead:
            group._mark_workers_dead(dead, "its actor was dead when the driver re-attached")
        if standby:
            group._standby = Standby(
                spec,
                standby,
                group._workers,
                adopted=adopted_spares,
                started=standby_started,
                devices=standby_devices,
            )
            group._ray.standby = group._standby
        else:  # this driver keeps no spares: the previous driver's go
            for spare in adopted_spares:
                rapi.kill(spare.actor)
        return group

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

    @property
    def standby_names(self) -> list[str]:
        """The Ray actor names of the spare actors waiting to take over a rank
        (``standby=N``; see ``_standby.py``)."""
        standby = self._ray.standby
        return [] if standby is None else [spare.name for spare in standby.spares]

    def wait_for_standby(self, timeout: float | None = None) -> None:
        """Wait until every spare actor has started (its modules imported), up to
        ``timeout`` seconds (default: the group's start timeout); spares start in the
        background, and a replacement does not need them started."""
        standby = self._ray.standby
        if standby is None:
            return
        limit = self._start_timeout if timeout is None else timeout
        refs = standby.refs()
        ranks = tuple(range(len(refs)))
        wait_refs(refs, ranks, "standby __init__", rapi.monotonic() + limit, limit, None)

    def alive_ranks(self) -> list[int]:
        """The ranks whose actors are alive now (asks the cluster)."""
        self.check_worker_aliveness()
        dead = set(self.dead_ranks)
        return [r for r in range(self.world_size) if r not in dead]

    def worker_node_ids(self) -> list[str | None]:
        """The Ray node id of each rank's actor, in rank order, from the cluster's actor
        table (no call into the actors, which may be busy); ``None`` for a rank whose actor
        is not placed or is gone."""
        self._sc_backend("worker_node_ids")  # a closed group refuses
        return [rapi.actor_node_id(actor) for actor in self._workers]

    def kill_worker(self, rank: int) -> None:
        """Kill ``rank``'s actor (no restart), for testing recovery, and wait until the
        cluster reports it dead (``ray.kill`` returns before the actor is gone), at most
        ``KILL_WAIT_S`` seconds. The rank is recorded dead: the next call touching it raises
        :class:`~sc_core.WorkerDiedError` until :meth:`replace_ranks` replaces it."""
        self._sc_backend("kill_worker")  # a closed group refuses
        actor = self._workers[self._checked_rank("kill_worker", rank)]
        rapi.kill(actor)
        self._mark_workers_dead([rank], "killed with kill_worker")
        deadline = rapi.monotonic() + KILL_WAIT_S
        while rapi.actor_state(actor) != "DEAD":
            if rapi.monotonic() >= deadline:
                logger.warning(
                    "RayWorkerGroup %r.kill_worker: rank %d's actor is not reported dead %.0f s "
                    "after ray.kill; the group treats it as dead",
                    self.name_prefix,
                    rank,
                    KILL_WAIT_S,
                )
                return
            time.sleep(0.05)

    # --- lifecycle --------------------------------------------------------------------------

    def shutdown(self, release_pool: bool = True) -> None:
        """verl's name for :meth:`close`: kill every actor of the group (detached ones too)
        and, when no other group uses it, release the pool's placement groups. A group
        attached with :meth:`from_detached` releases the placement groups its actors ran in
        (found through the actors); ``release_pool=False`` keeps them, and keeps this
        group's share of its pool (other groups placed in the same pool would be killed with
        it). Calling it again does nothing."""
        if not release_pool and not self.closed:
            self._ray.release_attached_pgs = False
            self._sc_runtime.pool = None
        self.close()

    def __deepcopy__(self, memo: dict[int, Any]) -> RayWorkerGroup:
        raise WorkerGroupError("a RayWorkerGroup cannot be deep-copied; use spawn()")

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"world_size={self.world_size}"
        return f"RayWorkerGroup({self.name_prefix!r}, {self.sub_cls_name or '?'}, {state})"
