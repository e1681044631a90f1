"""Placing a worker group's actors: environments, the rendezvous address, creation.

:func:`launch_actors` creates one actor per bundle slot of a placed pool, each with its
environment (WORLD_SIZE, RANK, ... and the user's ``worker_env``), all at once; the caller
waits for their constructors.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sc_core import InvalidConfigError
from sc_core.backend import free_port

from . import _ray_api as rapi
from ._actor_class import CONTROL_GROUP, CONTROL_THREADS, STANDBY_KWARG
from ._class_with_init import RayClassWithInitArgs, merge_options
from ._errors import RayResourcePoolError, WorkerEnvError
from ._resource_pool import BundleSlot, RayResourcePool
from ._settings import CORE_RENDEZVOUS, WORKER_START_TIMEOUT

__all__ = [
    "RESERVED_ENV_VARS",
    "Launched",
    "LaunchSpec",
    "check_worker_env",
    "create_standby",
    "launch_actors",
    "rank_env",
    "relaunch_actors",
    "rendezvous_address",
    "resolve_start_timeout",
]

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
    *CORE_RENDEZVOUS.names,
)


def resolve_start_timeout(given: float | None, fallback: float) -> float:
    """The seconds to wait for the actors' constructors: ``given``, else
    ``SC_RAY_WORKER_START_TIMEOUT_S``, else ``fallback``."""
    if given is not None:
        value: float | None = float(given)
    else:
        from_env = WORKER_START_TIMEOUT.get()
        value = float(fallback) if from_env is None else from_env
    if value is None or not value > 0:
        raise InvalidConfigError(f"RayWorkerGroup: start_timeout must be positive, got {value!r}")
    return value


def check_worker_env(worker_env: Mapping[str, str] | None) -> dict[str, str]:
    """``worker_env`` as a dict, refused if it sets a reserved variable or a non-str."""
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
    slot: BundleSlot, master_addr: str | None, master_port: int | str | None, timeout: float
) -> tuple[str, str]:
    node_id = rapi.placement_group_bundle_nodes(slot.placement_group)[slot.bundle_index]
    if master_addr is None:
        nodes = {n.node_id: n for n in rapi.list_nodes()}
        node = nodes.get(node_id)
        master_addr = node.ip if node is not None else rapi.node_ip_address()
    if master_port is None:
        if node_id == rapi.current_node_id():
            master_port = free_port()
        else:
            ref = rapi.run_task(
                free_port,
                {"num_cpus": 0, "scheduling_strategy": rapi.node_affinity(node_id)},
            )
            master_port = int(rapi.get([ref], timeout_s=timeout)[0])
    return str(master_addr), str(master_port)


def _check_fits(pool: RayResourcePool, cls: RayClassWithInitArgs) -> None:
    bundle = pool.bundle()
    asked = {"CPU": cls._options.get("num_cpus"), "GPU": cls._options.get("num_gpus")}
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


@dataclass
class Launched:
    """The actors of a group, in rank order, and where rank 0 listens."""

    workers: list[rapi.ActorHandle]
    names: list[str]
    master_addr: str
    master_port: str


@dataclass
class LaunchSpec:
    """Everything needed to create a group's actors again (kept by the group for
    :func:`relaunch_actors`)."""

    pool: RayResourcePool
    cia: RayClassWithInitArgs
    actor_cls: type
    name_prefix: str
    worker_env: Mapping[str, str]
    master_addr: str | None
    master_port: int | str | None
    detached: bool


def _prepare(spec: LaunchSpec) -> Any:
    """The remote class, with the options checked (once per launch); a detached group's
    actors get the control lane's concurrency group (``_actor_class.CONTROL_GROUP``)."""
    cia = spec.cia
    decorated = rapi.remote_class_options(cia.cls)
    if decorated:
        cia._options = merge_options(decorated, cia._options)
    _check_fits(spec.pool, cia)
    user_env = (cia._options.get("runtime_env") or {}).get("env_vars") or {}
    clash = sorted(k for k in user_env if k in RESERVED_ENV_VARS)
    if clash:
        raise WorkerEnvError(
            f"RayWorkerGroup: the runtime_env of {cia.worker_cls.__name__} sets {clash}, which "
            f"the worker group sets for each worker ({', '.join(RESERVED_ENV_VARS)})"
        )
    groups = {CONTROL_GROUP: CONTROL_THREADS} if spec.detached else None
    return rapi.remote_class(spec.actor_cls, groups)


def rank_env(
    spec: LaunchSpec, slot: BundleSlot, rank: int, world: int, addr: str, port: str
) -> dict[str, str]:
    """The environment the worker of ``rank`` gets (before the user's ``worker_env``)."""
    return {
        "WORLD_SIZE": str(world),
        "RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(slot.local_world_size),
        "LOCAL_RANK": str(slot.local_rank),
        "WG_PREFIX": spec.name_prefix,
        "WG_BACKEND": "ray",
        "RAY_LOCAL_WORLD_SIZE": str(slot.local_world_size),
        "RAY_LOCAL_RANK": str(slot.local_rank),
        "MASTER_ADDR": addr,
        "MASTER_PORT": port,
        **spec.worker_env,
    }


def _create(
    spec: LaunchSpec,
    remote_cls: Any,
    slot: BundleSlot,
    rank: int,
    world: int,
    addr: str,
    port: str,
    name: str,
) -> rapi.ActorHandle:
    pool, cia = spec.pool, spec.cia
    env = rank_env(spec, slot, rank, world, addr, port)
    share = pool.actor_resources()
    options = cia.actor_options(
        slot.placement_group,
        slot.bundle_index,
        use_gpu=pool.use_gpu,
        num_gpus=share.get("num_gpus", share.get(pool.device_resource, 0.0)),
        device_name=pool.device_name,
        num_cpus=share["num_cpus"],
        name=name,
        lifetime="detached" if spec.detached else None,
    )
    kwargs = {**cia.kwargs, "_sc_env": env}
    return rapi.create_actor(remote_cls, options, cia.args, kwargs)


def create_standby(spec: LaunchSpec, slot: BundleSlot, name: str) -> rapi.ActorHandle:
    """A spare actor of the group's class on ``slot``'s bundle: its modules imported, no
    worker built, no resources reserved (see ``_standby.py``)."""
    options = spec.cia.actor_options(
        slot.placement_group,
        slot.bundle_index,
        use_gpu=False,
        num_cpus=0,
        name=name,
        lifetime="detached" if spec.detached else None,
    )
    return rapi.create_actor(_prepare(spec), options, (), {STANDBY_KWARG: True})


def rendezvous_address(spec: LaunchSpec, timeout: float) -> tuple[str, str]:
    """A new rendezvous address: rank 0's node and a free port there (unless the group was
    given them)."""
    slots = spec.pool.bundle_slots()
    return _discover_master(slots[0], spec.master_addr, spec.master_port, timeout)


def _slot_name(spec: LaunchSpec, slot: BundleSlot) -> str:
    return f"{spec.name_prefix}{spec.cia.worker_cls.__name__}_{slot.node_index}:{slot.local_rank}"


def _create_slots(
    spec: LaunchSpec,
    ranks: list[int],
    suffix: str,
    timeout: float,
    created: dict[int, rapi.ActorHandle],
) -> tuple[dict[int, str], str, str]:
    """Create the actors of ``ranks`` on their bundle slots, named with ``suffix``, each put
    in ``created`` at once; returns their names and the rendezvous address (rank 0's node
    and a free port there, unless the group was given them)."""
    slots = spec.pool.bundle_slots()
    addr, port = rendezvous_address(spec, timeout)
    remote_cls = _prepare(spec)
    names = {}
    for rank in ranks:
        names[rank] = f"{_slot_name(spec, slots[rank])}{suffix}"
        created[rank] = _create(
            spec, remote_cls, slots[rank], rank, len(slots), addr, port, names[rank]
        )
    return names, addr, port


def launch_actors(spec: LaunchSpec, *, timeout: float, created: list[rapi.ActorHandle]) -> Launched:
    """Create one actor per bundle slot of the placed pool. Every actor created is appended
    to ``created`` at once, so the caller can kill them on a failure."""
    by_rank: dict[int, rapi.ActorHandle] = {}
    world = len(spec.pool.bundle_slots())
    try:
        names, addr, port = _create_slots(spec, list(range(world)), "", timeout, by_rank)
    finally:
        created.extend(by_rank[r] for r in sorted(by_rank))
    return Launched(list(created), [names[r] for r in range(world)], addr, port)


def relaunch_actors(
    spec: LaunchSpec,
    ranks: list[int],
    generation: int,
    *,
    timeout: float,
    created: dict[int, rapi.ActorHandle],
) -> tuple[dict[int, str], str, str]:
    """Create new actors for ``ranks`` on their bundle slots (named with ``generation``, as
    the old names may still be taken), with a new rendezvous port on rank 0's node (unless
    the group was given one); returns their names and the rendezvous address. Each actor is
    put in ``created`` at once."""
    return _create_slots(spec, ranks, f"-g{generation}", timeout, created)
