"""Runs that outlive their driver: :class:`RayRun`.

A run is a registry actor (``_run_registry.py``), pools whose placement groups are detached
and named after the run, worker groups whose actors (and standby spares) are detached and
named in the run's Ray namespace (``_run_names.py``), and other named actors the caller
records (:meth:`RayRun.record_actors`: an engine-server fleet). One driver at a time holds
the run's lease (fenced by an epoch, kept by a heartbeat thread); a new driver
:meth:`RayRun.attach` es to the live actors once the lease is free, without restarting or
re-initialising any worker, after checking that its own pools, classes, code and
configuration match the run's (``_fingerprint.py``).
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from typing import Any

from sc_core import InvalidConfigError

from . import _ray_api as rapi
from ._class_with_init import RayClassWithInitArgs
from ._errors import (
    RunExistsError,
    RunIdError,
    RunInUseError,
    RunMismatchError,
    UnknownRunError,
)
from ._resource_pool import RayResourcePool
from ._run_attach import qualname, reattach_group
from ._run_names import NAMESPACE_PREFIX, REGISTRY_NAME, check_run_id, pg_prefix, run_namespace
from ._run_registry import RunRegistry
from ._run_teardown import RECORD_KINDS, RunInfo, release_run_resources, stop_methods
from ._worker_group import RayWorkerGroup

__all__ = ["RayRun"]

logger = logging.getLogger("sc_ray.runs")

#: How long a driver waits for the registry or a worker to answer (seconds).
CALL_TIMEOUT_S = 30.0
#: The keys of a pool's spec a re-attaching driver must repeat.
_POOL_KEYS = (
    "process_on_nodes",
    "use_gpu",
    "max_colocate_count",
    "device_name",
    "num_cpus_per_process",
    "accelerator_type",
    "strategy",
)


def _connected(run_id: str, where: str) -> str:
    namespace = run_namespace(run_id)
    if not rapi.is_initialized():
        raise RunIdError(
            f"{where}({run_id!r}): Ray is not initialised; connect with "
            f"ray.init(address=..., namespace={namespace!r})"
        )
    current = rapi.current_namespace()
    if current != namespace:
        raise RunIdError(
            f"{where}({run_id!r}): this driver is connected in Ray namespace {current!r}; "
            f"a run's driver must connect with ray.init(address=..., namespace={namespace!r})"
        )
    return namespace


def _holder() -> dict[str, Any]:
    return {"pid": rapi.process_id(), "host": socket.gethostname(), "job_id": rapi.current_job_id()}


def _ask(actor: rapi.ActorHandle, method: str, *args: Any) -> Any:
    return rapi.get([rapi.call_actor(actor, method, args, {})], timeout_s=CALL_TIMEOUT_S)[0]


class RayRun:
    """A run on a standing Ray cluster that outlives its driver (see the module docstring and
    docs/packages/sc-ray.md, "Runs that outlive their driver"). Build one with
    :meth:`create` or :meth:`attach`, never directly."""

    def __init__(
        self,
        run_id: str,
        registry: rapi.ActorHandle,
        epoch: int,
        attached: bool,
        state: dict[str, Any],
    ) -> None:
        self._run_id = run_id
        self._namespace = run_namespace(run_id)
        self._registry = registry
        self._epoch = epoch
        self._attached = attached
        self._state = state
        for kind in RECORD_KINDS:
            state.setdefault(kind, {})
        self._heartbeat_s = float(state["heartbeat_s"])
        self._pools: dict[int, str] = {}  # id(pool) -> name
        self._stop = threading.Event()
        self._fenced = False
        self._done = False
        self._thread = threading.Thread(
            target=self._beat, name=f"sc-run-heartbeat-{run_id}", daemon=True
        )
        self._thread.start()

    # --- create / attach ------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        run_id: str,
        *,
        abandon_after_s: float = 600.0,
        lease_s: float = 10.0,
        heartbeat_s: float = 1.0,
    ) -> RayRun:
        """Register run ``run_id`` (its registry actor) and take its lease (epoch 1).
        :class:`RunExistsError` if the cluster holds anything of the run already."""
        namespace = _connected(check_run_id(run_id), "RayRun.create")
        for what, value in (
            ("abandon_after_s", abandon_after_s),
            ("lease_s", lease_s),
            ("heartbeat_s", heartbeat_s),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise InvalidConfigError(f"RayRun.create: {what} must be > 0, got {value!r}")
        if heartbeat_s >= lease_s:
            raise InvalidConfigError(
                f"RayRun.create: heartbeat_s ({heartbeat_s}) must be shorter than lease_s "
                f"({lease_s}), or the lease lapses between heartbeats"
            )
        actors = rapi.named_actors(namespace)
        groups = rapi.placement_groups_named(pg_prefix(namespace))
        if actors or groups:
            raise RunExistsError(
                f"RayRun.create({run_id!r}): the run exists (actors {actors}, placement groups "
                f"{sorted(groups.values())}); attach with RayRun.attach({run_id!r}) or tear it "
                f"down with teardown_run({run_id!r})"
            )
        options = {
            "name": REGISTRY_NAME,
            "namespace": namespace,
            "lifetime": "detached",
            "num_cpus": 0,
            "max_concurrency": 4,
            "max_restarts": 0,
        }
        args = (run_id, namespace, abandon_after_s, lease_s, heartbeat_s, _holder())
        try:
            registry = rapi.create_actor(rapi.remote_class(RunRegistry), options, args, {})
        except ValueError as exc:  # the name was taken meanwhile
            raise RunExistsError(f"RayRun.create({run_id!r}): the run exists ({exc})") from exc
        state: dict[str, Any] = _ask(registry, "state")
        logger.info("run %s created in namespace %s", run_id, namespace)
        return cls(run_id, registry, 1, False, state)

    @classmethod
    def attach(cls, run_id: str, *, lease_s: float | None = None) -> RayRun:
        """Take over run ``run_id`` from a driver that died or released it. The lease is
        free when its holder's heartbeat is older than ``lease_s`` (default: the run's), or
        at once when the cluster reports the holder's job dead; taken by compare-and-set
        on the epoch (the new epoch is the old one + 1)."""
        namespace = _connected(check_run_id(run_id), "RayRun.attach")
        try:
            registry = rapi.get_actor(REGISTRY_NAME)
        except ValueError:
            runs = [
                ns[len(NAMESPACE_PREFIX) :]
                for ns in rapi.namespaces_with_actor(REGISTRY_NAME)
                if ns.startswith(NAMESPACE_PREFIX)
            ]
            raise UnknownRunError(
                f"RayRun.attach({run_id!r}): no run {run_id!r} on this cluster (no actor "
                f"{REGISTRY_NAME!r} in namespace {namespace!r}); runs found: {runs or 'none'}"
            ) from None
        state: dict[str, Any] = _ask(registry, "state")
        limit = float(state["lease_s"] if lease_s is None else lease_s)
        holder = state["holder"]
        if holder is not None and state["beat_age"] < limit:
            dead = rapi.job_is_dead(str(holder.get("job_id", "")))
            if dead is not True:
                raise RunInUseError(
                    f"RayRun.attach({run_id!r}): the run's lease (epoch {state['epoch']}) is "
                    f"held by the driver pid {holder.get('pid')} on host {holder.get('host')} "
                    f"(Ray job {holder.get('job_id')}), whose last heartbeat is "
                    f"{state['beat_age']:.1f} s old (lease_s={limit:g}); stop that driver or "
                    "let it call run.release()"
                )
        epoch = _ask(registry, "take_lease", state["epoch"], _holder())
        if epoch is None:
            raise RunInUseError(
                f"RayRun.attach({run_id!r}): another driver took the lease at the same time"
            )
        state = _ask(registry, "state")
        logger.warning("run %s: re-attached at epoch %d", run_id, epoch)
        return cls(run_id, registry, int(epoch), True, state)

    # --- accessors ----------------------------------------------------------------------

    @property
    def run_id(self) -> str:
        return self._run_id

    @property
    def namespace(self) -> str:
        """The run's Ray namespace (``sc-run-<run_id>``)."""
        return self._namespace

    @property
    def epoch(self) -> int:
        """The lease epoch this driver holds (1 for the creator, +1 per attach)."""
        return self._epoch

    @property
    def attached(self) -> bool:
        """Whether this driver re-attached (else it created the run)."""
        return self._attached

    @property
    def fenced(self) -> bool:
        """Whether another driver took the lease from this one (seen at a heartbeat)."""
        return self._fenced

    # --- the lease ----------------------------------------------------------------------

    def _beat(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            try:
                ok = _ask(self._registry, "heartbeat", self._epoch)
            except Exception as exc:  # the registry is slow, or gone (teardown, abandonment)
                logger.warning("run %s: heartbeat failed: %s", self._run_id, exc)
                continue
            if not ok:
                self._fenced = True
                logger.error(
                    "run %s: this driver (epoch %d) lost the lease to another driver; it "
                    "must stop driving the run",
                    self._run_id,
                    self._epoch,
                )
                return

    def _stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=CALL_TIMEOUT_S)

    def _check_live(self, where: str) -> None:
        if self._done:
            raise RunInUseError(f"RayRun({self._run_id!r}).{where}: the run was released")
        if self._fenced:
            raise RunInUseError(
                f"RayRun({self._run_id!r}).{where}: this driver (epoch {self._epoch}) lost "
                "the run's lease to another driver"
            )

    def _record(self, kind: str, name: str, value: dict[str, Any]) -> None:
        if not _ask(self._registry, "record", self._epoch, kind, name, value):
            self._fenced = True
            raise RunInUseError(
                f"RayRun({self._run_id!r}): recording {kind[:-1]} {name!r} failed: this "
                f"driver (epoch {self._epoch}) lost the run's lease to another driver"
            )
        self._state[kind][name] = value

    def release(self) -> None:
        """Leave the run running: stop the heartbeat and free the lease, so that another
        driver can attach at once. The run is torn down ``abandon_after_s`` later unless a
        driver attaches."""
        if self._done:
            return
        self._done = True
        self._stop_heartbeat()
        try:
            _ask(self._registry, "release", self._epoch)
        except Exception as exc:
            logger.warning("run %s: releasing the lease failed: %s", self._run_id, exc)

    def teardown(self) -> RunInfo:
        """Stop the recorded actors that have a stop method (:meth:`record_actors`), kill
        every actor of the run (workers, spares, replacements, recorded actors, the
        registry) and remove every placement group of the run."""
        self._done = True
        self._stop_heartbeat()
        stops = stop_methods(self._state)
        actors, groups = release_run_resources(self._namespace, keep_registry=False, stops=stops)
        return RunInfo(self._run_id, tuple(actors), tuple(groups))

    # --- other actors -------------------------------------------------------------------

    def actors(self, name: str) -> dict[str, Any] | None:
        """The record of the run's actor set ``name`` (:meth:`record_actors`), or ``None``
        when the run has none of that name (a new run, or a driver that died before making
        them)."""
        record = self._state["actors"].get(name)
        return None if record is None else dict(record)

    def record_actors(
        self,
        name: str,
        names: Sequence[str],
        *,
        stop_method: str | None = None,
        **facts: Any,
    ) -> None:
        """Record actor set ``name``: actors the caller created beside the run's worker
        groups (an engine-server fleet), detached and named ``names`` in the run's
        namespace, so that a driver that re-attaches finds them (:meth:`actors`) and a
        teardown releases them. ``stop_method``: a method of theirs a teardown calls first
        (at most ``STOP_TIMEOUT_S`` seconds; to end what they started, such as a server
        process); ``facts``: what the caller needs to find or check them again (JSON-like
        values). Recording a name again replaces its record."""
        self._check_live("record_actors")
        bad = [n for n in names if not isinstance(n, str) or not n]
        if isinstance(names, str) or bad:
            raise InvalidConfigError(
                f"RayRun({self._run_id!r}).record_actors({name!r}): names must be a sequence "
                f"of non-empty actor names, got {names!r}"
            )
        value = {**facts, "names": list(names), "stop_method": stop_method}
        self._record("actors", name, value)

    # --- pools and groups ---------------------------------------------------------------

    def resource_pool(
        self,
        name: str,
        process_on_nodes: Sequence[int],
        *,
        use_gpu: bool = False,
        max_colocate_count: int = 10,
        device_name: str = "cuda",
        num_cpus_per_process: float = 1.0,
        accelerator_type: str | None = None,
        strategy: str = "STRICT_PACK",
        placement_timeout_s: float | None = None,
    ) -> RayResourcePool:
        """The run's pool ``name``: placed now (detached placement groups named
        ``<namespace>:<name>:<i>``) and recorded, or, when the run has it already, rebuilt
        from its recorded placement groups (:class:`RunMismatchError` if the spec differs)."""
        self._check_live("resource_pool")
        spec: dict[str, Any] = {
            "process_on_nodes": [int(n) for n in process_on_nodes],
            "use_gpu": bool(use_gpu),
            "max_colocate_count": int(max_colocate_count),
            "device_name": str(device_name).lower(),
            "num_cpus_per_process": float(num_cpus_per_process),
            "accelerator_type": accelerator_type,
            "strategy": strategy,
        }
        pool = RayResourcePool(
            spec["process_on_nodes"],
            use_gpu=use_gpu,
            name_prefix=f"{pg_prefix(self._namespace)}{name}:",
            max_colocate_count=max_colocate_count,
            detached=True,
            accelerator_type=accelerator_type,
            device_name=device_name,
            num_cpus_per_process=num_cpus_per_process,
            placement_timeout_s=placement_timeout_s,
        )
        recorded = self._state["pools"].get(name)
        if recorded is None:
            pgs = pool.get_placement_groups(strategy, name=pool.name_prefix)
            names = [rapi.placement_group_name(pg) for pg in pgs]
            self._record("pools", name, {"spec": spec, "placement_groups": names})
        else:
            diffs = [
                f"{k}: the run has {recorded['spec'].get(k)!r}, this driver asks {spec[k]!r}"
                for k in _POOL_KEYS
                if recorded["spec"].get(k) != spec[k]
            ]
            if diffs:
                raise RunMismatchError(
                    f"run {self._run_id!r} pool {name!r} differs: " + "; ".join(diffs)
                )
            pg_names: list[str] = recorded["placement_groups"]
            found = [rapi.get_placement_group(n) for n in pg_names]
            gone = [n for n, pg in zip(pg_names, found, strict=True) if pg is None]
            if gone:
                raise RunMismatchError(
                    f"run {self._run_id!r} pool {name!r}: its placement groups {gone} are "
                    f"gone; tear the run down (teardown_run({self._run_id!r})) and start again"
                )
            pool.pgs = [pg for pg in found if pg is not None]
        self._pools[id(pool)] = name
        return pool

    def worker_group(
        self,
        name: str,
        resource_pool: RayResourcePool,
        ray_cls_with_init: RayClassWithInitArgs[Any],
        **kwargs: Any,
    ) -> RayWorkerGroup[Any]:
        """The run's worker group ``name`` on ``resource_pool`` (a pool of this run):
        created (detached actors named in the run's namespace) and recorded, or, when the
        run has it already, rebuilt over its live actors (``_run_attach.reattach_group``:
        dead ranks marked dead, code and configuration checked; with ``standby=N`` the
        previous driver's live spares adopted, and recorded again as they change).
        ``kwargs`` go to :class:`RayWorkerGroup` (not ``name_prefix`` nor ``detached``)."""
        self._check_live("worker_group")
        pool_name = self._pools.get(id(resource_pool))
        if pool_name is None:
            raise InvalidConfigError(
                f"RayRun({self._run_id!r}).worker_group({name!r}): resource_pool is not a "
                "pool of this run; make it with run.resource_pool(...)"
            )
        taken = sorted({"name_prefix", "detached"} & set(kwargs))
        if taken:
            raise InvalidConfigError(
                f"RayRun({self._run_id!r}).worker_group({name!r}): the run sets {taken} itself"
            )
        recorded = self._state["groups"].get(name)
        if recorded is None:
            group: RayWorkerGroup[Any] = RayWorkerGroup(
                resource_pool,
                ray_cls_with_init,
                name_prefix=f"{name}-",
                detached=True,
                **kwargs,
            )
            record: dict[str, Any] = {
                "pool": pool_name,
                "name_prefix": group.name_prefix,
                "cls": qualname(ray_cls_with_init),
                "generation": 0,
            }
        else:
            where = f"run {self._run_id!r} group {name!r}"
            group = reattach_group(
                where, recorded, pool_name, resource_pool, ray_cls_with_init, kwargs
            )
            record = dict(recorded)
        self._record("groups", name, {**record, **_group_facts(group, int(record["generation"]))})

        def on_replaced(names: list[str], addr: str, port: str, generation: int) -> None:
            self._check_live("replace_ranks")
            facts = {**_group_facts(group, generation), "workers": names}
            facts["master_addr"], facts["master_port"] = addr, port
            self._record("groups", name, {**self._state["groups"][name], **facts})

        group._ray.on_replaced = on_replaced
        return group

    def __repr__(self) -> str:
        how = "attached" if self._attached else "created"
        return f"RayRun({self._run_id!r}, epoch={self._epoch}, {how})"


def _group_facts(group: RayWorkerGroup[Any], generation: int) -> dict[str, Any]:
    standby = group._ray.standby
    return {
        "workers": group.worker_names,
        "spares": group.standby_names,
        "master_addr": group.master_address,
        "master_port": group.master_port,
        "generation": generation,
        **({} if standby is None else standby.facts()),
    }
