"""The one module that talks to Ray.

Ray's Python API is loosely typed (mypy sees it as ``Any``). Every other module of sc-ray
calls Ray only through the typed functions here, so an untyped value never leaks past this
file. Handles are opaque: :class:`ObjectRef`, :class:`ActorHandle`, :class:`PlacementGroup`
and :class:`RemoteClass` are, for the type checker, classes with no public attributes; at run
time they are Ray's own objects.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import ray as _ray
import ray.exceptions as _ray_exceptions
import ray.util.scheduling_strategies as _ray_strategies

# Ray is only partly annotated; everything of it is used as ``Any`` here, and every value
# leaves this module through an annotated function.
ray: Any = _ray
_exc: Any = _ray_exceptions
# ``ray.util.placement_group`` is both a module and, on ``ray.util``, a function.
_pg_mod: Any = importlib.import_module("ray.util.placement_group")
NodeAffinitySchedulingStrategy: Any = _ray_strategies.NodeAffinitySchedulingStrategy
PlacementGroupSchedulingStrategy: Any = _ray_strategies.PlacementGroupSchedulingStrategy

__all__ = [
    "ActorHandle",
    "ActorState",
    "NodeInfo",
    "ObjectRef",
    "PlacementGroup",
    "RemoteClass",
    "RemoteFailure",
    "SimulatedCluster",
    "SchedulingStrategy",
    "actor_id",
    "actor_node_and_devices",
    "actor_state",
    "actor_states",
    "available_resources",
    "call_actor",
    "call_actor_multi",
    "call_in_actor",
    "cancel",
    "classify_failure",
    "cluster_resources",
    "create_actor",
    "create_placement_group",
    "current_node_id",
    "disable_uv_run_propagation",
    "find_free_port",
    "get",
    "get_actor",
    "get_placement_group",
    "gpu_ids",
    "is_actor_handle",
    "init_local",
    "is_get_timeout",
    "is_initialized",
    "is_ready",
    "is_object_ref",
    "is_remote_class",
    "kill",
    "list_nodes",
    "node_affinity",
    "node_ip_address",
    "placement_group_bundle_nodes",
    "actor_placement_group",
    "placement_group_bundles",
    "placement_group_id",
    "placement_group_name",
    "placement_group_state",
    "placement_group_states",
    "placement_strategy",
    "put",
    "register_serializer",
    "ready_ref",
    "remote_class",
    "remote_class_options",
    "remove_placement_group",
    "run_task",
    "shutdown",
    "unwrap_remote_class",
    "wait",
    "wait_placement_group",
    "monotonic",
]

logger = logging.getLogger("sc_ray")

if TYPE_CHECKING:

    class ObjectRef:
        """A reference to a value in Ray's object store (``ray.ObjectRef``)."""

    class ActorHandle:
        """A handle to a Ray actor (``ray.actor.ActorHandle``)."""

    class PlacementGroup:
        """A Ray placement group (``ray.util.placement_group.PlacementGroup``)."""

    class RemoteClass:
        """A class wrapped by ``ray.remote`` (``ray.actor.ActorClass``)."""

    class SchedulingStrategy:
        """A Ray scheduling strategy object."""

else:
    ObjectRef = ray.ObjectRef
    ActorHandle = ray.actor.ActorHandle
    PlacementGroup = _pg_mod.PlacementGroup
    RemoteClass = ray.actor.ActorClass
    SchedulingStrategy = object


# --- cluster state -----------------------------------------------------------------------


def is_initialized() -> bool:
    """Whether this process is connected to a Ray cluster."""
    return bool(ray.is_initialized())


@dataclass(frozen=True)
class NodeInfo:
    """One node of the cluster as the driver sees it."""

    node_id: str
    ip: str
    hostname: str
    alive: bool
    resources: dict[str, float] = field(default_factory=dict)


def list_nodes() -> list[NodeInfo]:
    """Every node the cluster knows, alive or not."""
    out: list[NodeInfo] = []
    for raw in ray.nodes():
        out.append(
            NodeInfo(
                node_id=str(raw.get("NodeID", "")),
                ip=str(raw.get("NodeManagerAddress", "")),
                hostname=str(raw.get("NodeManagerHostname", "")),
                alive=bool(raw.get("Alive", raw.get("alive", False))),
                resources={str(k): float(v) for k, v in dict(raw.get("Resources", {})).items()},
            )
        )
    return out


def cluster_resources() -> dict[str, float]:
    """The total resources of the alive nodes."""
    return {str(k): float(v) for k, v in ray.cluster_resources().items()}


def available_resources() -> dict[str, float]:
    """The resources not held by any task, actor or placement group right now."""
    return {str(k): float(v) for k, v in ray.available_resources().items()}


def current_node_id() -> str:
    """The node id of the calling process (driver or worker)."""
    return str(ray.get_runtime_context().get_node_id())


def node_ip_address() -> str:
    """The IP address of the calling process's node."""
    return str(ray.util.get_node_ip_address())


def gpu_ids() -> list[str]:
    """The accelerator ids Ray assigned to the calling worker, as strings."""
    return [str(g) for g in ray.get_gpu_ids()]


def find_free_port() -> int:
    """A TCP port that was free on this host when asked."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


# --- placement groups --------------------------------------------------------------------


def create_placement_group(
    bundles: Sequence[Mapping[str, float]],
    strategy: str,
    name: str,
    lifetime: str | None,
) -> PlacementGroup:
    """Ask Ray for a placement group; returns at once (see :func:`wait_placement_group`)."""
    pg = _pg_mod.placement_group(
        bundles=[dict(b) for b in bundles], strategy=strategy, name=name, lifetime=lifetime
    )
    return cast("PlacementGroup", pg)


def wait_placement_group(pg: PlacementGroup, timeout_s: float | None) -> bool:
    """Wait until every bundle of ``pg`` is reserved; ``False`` if ``timeout_s`` ran out."""
    ready, _ = ray.wait([cast(Any, pg).ready()], num_returns=1, timeout=timeout_s)
    return bool(ready)


def remove_placement_group(pg: PlacementGroup) -> None:
    """Release a placement group (and kill what runs in it); a removed one is ignored."""
    with contextlib.suppress(Exception):
        _pg_mod.remove_placement_group(pg)


def get_placement_group(name: str) -> PlacementGroup | None:
    """The live placement group called ``name`` in this namespace, or ``None``."""
    try:
        pg = _pg_mod.get_placement_group(name)
    except ValueError:
        return None
    return cast("PlacementGroup", pg)


def placement_group_id(pg: PlacementGroup) -> str:
    """The hex id of a placement group."""
    return str(cast(Any, pg).id.hex())


def _table(pg: PlacementGroup) -> dict[str, Any]:
    return cast("dict[str, Any]", _pg_mod.placement_group_table(pg))


def placement_group_name(pg: PlacementGroup) -> str:
    """The name a placement group was created with."""
    return str(_table(pg).get("name", ""))


def placement_group_state(pg: PlacementGroup) -> str:
    """``PENDING``, ``CREATED``, ``REMOVED``, ``RESCHEDULING`` (Ray's spelling)."""
    return str(_table(pg).get("state", "UNKNOWN"))


def placement_group_states() -> dict[str, tuple[str, str]]:
    """Every placement group of the cluster: ``{id: (name, state)}``."""
    table = cast("dict[str, dict[str, Any]]", _pg_mod.placement_group_table())
    return {str(k): (str(v.get("name", "")), str(v.get("state", ""))) for k, v in table.items()}


def placement_group_bundles(pg: PlacementGroup) -> list[dict[str, float]]:
    """The resources of each bundle of ``pg``."""
    specs = cast(Any, pg).bundle_specs
    return [{str(k): float(v) for k, v in dict(b).items()} for b in specs]


def placement_group_bundle_nodes(pg: PlacementGroup) -> list[str]:
    """The node id each bundle of a ready placement group sits on, in bundle order."""
    raw = cast("dict[Any, Any]", _table(pg).get("bundles_to_node_id", {}))
    return [str(raw[k]) for k in sorted(raw)]


def placement_strategy(
    pg: PlacementGroup, bundle_index: int, capture_child_tasks: bool = False
) -> SchedulingStrategy:
    """Schedule onto bundle ``bundle_index`` of ``pg``."""
    return cast(
        "SchedulingStrategy",
        PlacementGroupSchedulingStrategy(
            placement_group=pg,
            placement_group_bundle_index=bundle_index,
            placement_group_capture_child_tasks=capture_child_tasks,
        ),
    )


def node_affinity(node_id: str, soft: bool = False) -> SchedulingStrategy:
    """Schedule onto the node ``node_id``."""
    return cast("SchedulingStrategy", NodeAffinitySchedulingStrategy(node_id=node_id, soft=soft))


# --- actors ------------------------------------------------------------------------------


def remote_class(cls: object) -> RemoteClass:
    """``ray.remote(cls)`` (a class already wrapped is returned as it is)."""
    if isinstance(cls, ray.actor.ActorClass):
        return cast("RemoteClass", cls)
    return cast("RemoteClass", ray.remote(cls))


def create_actor(
    remote_cls: RemoteClass,
    options: Mapping[str, Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> ActorHandle:
    """``remote_cls.options(**options).remote(*args, **kwargs)``."""
    handle = cast(Any, remote_cls).options(**dict(options)).remote(*args, **dict(kwargs))
    return cast("ActorHandle", handle)


def call_actor(
    actor: ActorHandle, method: str, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> ObjectRef:
    """``actor.<method>.remote(*args, **kwargs)``."""
    return cast("ObjectRef", getattr(actor, method).remote(*args, **dict(kwargs)))


def get_actor(name: str, namespace: str | None = None) -> ActorHandle:
    """The named actor ``name``; raises ``ValueError`` if there is none."""
    return cast("ActorHandle", ray.get_actor(name, namespace=namespace))


def kill(actor: ActorHandle) -> None:
    """Kill an actor without restarting it; an actor already dead is ignored."""
    with contextlib.suppress(Exception):
        ray.kill(actor, no_restart=True)


def actor_id(actor: ActorHandle) -> str:
    """The hex id of an actor."""
    return str(cast(Any, actor)._actor_id.hex())


@dataclass(frozen=True)
class ActorState:
    """What the cluster's control store says about one actor."""

    actor_id: str
    name: str
    state: str
    class_name: str


def actor_states() -> dict[str, ActorState]:
    """Every actor this cluster has known, keyed by hex id (``ALIVE``, ``DEAD``, ...)."""
    from ray._private import state as _state

    out: dict[str, ActorState] = {}
    for key, raw in cast("dict[Any, dict[str, Any]]", _state.actors()).items():
        out[str(key)] = ActorState(
            actor_id=str(key),
            name=str(raw.get("Name", "")),
            state=str(raw.get("State", "")),
            class_name=str(raw.get("ActorClassName", "")),
        )
    return out


def is_actor_handle(obj: object) -> bool:
    """Whether ``obj`` is a Ray actor handle."""
    return isinstance(obj, ray.actor.ActorHandle)


# --- tasks and objects -------------------------------------------------------------------


def run_task(
    fn: Callable[..., Any], options: Mapping[str, Any], args: Sequence[Any] = ()
) -> ObjectRef:
    """Run ``fn`` as a Ray task with ``options``; returns the reference to its result."""
    remote_fn = ray.remote(fn)
    return cast("ObjectRef", remote_fn.options(**dict(options)).remote(*args))


def is_object_ref(obj: object) -> bool:
    """Whether ``obj`` is a Ray object reference."""
    return isinstance(obj, ray.ObjectRef)


def put(value: object) -> ObjectRef:
    """Store ``value`` in the object store once and return its reference."""
    return cast("ObjectRef", ray.put(value))


def is_get_timeout(exc: BaseException) -> bool:
    """Whether ``exc`` is Ray's ``GetTimeoutError`` (a ``get`` that ran out of time)."""
    return isinstance(exc, _exc.GetTimeoutError)


def get(refs: Sequence[ObjectRef], timeout_s: float | None = None) -> list[Any]:
    """The values of ``refs``, in order. Raises Ray's exceptions (see :func:`classify_failure`)."""
    return list(ray.get(list(refs), timeout=timeout_s))


def wait(
    refs: Sequence[ObjectRef], num_returns: int, timeout_s: float | None
) -> tuple[list[ObjectRef], list[ObjectRef]]:
    """``ray.wait`` without fetching: ``(ready, not_ready)`` after at most ``timeout_s``."""
    if not refs:
        return [], []
    ready, not_ready = ray.wait(
        list(refs), num_returns=num_returns, timeout=timeout_s, fetch_local=False
    )
    return list(ready), list(not_ready)


def is_ready(ref: ObjectRef) -> bool:
    """Whether the value behind ``ref`` exists (or its task failed), without fetching it."""
    ready, _ = wait([ref], 1, 0)
    return bool(ready)


def cancel(ref: ObjectRef) -> bool:
    """Ask Ray to cancel the task behind ``ref``: a queued task is dropped, a running method
    of an asyncio actor gets ``CancelledError``; a running method of any other actor goes on.
    Returns whether Ray accepted the request."""
    try:
        ray.cancel(ref, force=False)
    except Exception as exc:  # already finished, or not cancellable
        logger.debug("ray.cancel(%s) refused: %s", ref, exc)
        return False
    return True


def register_serializer(
    cls: type, serializer: Callable[[Any], Any], deserializer: Callable[[Any], Any]
) -> None:
    """``ray.util.register_serializer`` (for this process's serialization context)."""
    ray.util.register_serializer(cls, serializer=serializer, deserializer=deserializer)


# --- failures ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RemoteFailure:
    """A Ray exception, sorted: ``kind`` is ``"died"`` (the actor is gone), ``"raised"``
    (the method raised ``cause``), or ``"other"``."""

    kind: str
    cause: BaseException
    cause_type: str
    traceback: str


def classify_failure(exc: BaseException) -> RemoteFailure:
    """Sort an exception raised by :func:`get` on one reference."""
    if isinstance(exc, _exc.RayActorError) and getattr(exc, "actor_init_failed", False):
        # The constructor raised: report it like a method that raised.
        inner = next((a for a in exc.args if isinstance(a, _exc.RayTaskError)), None)
        if inner is not None:
            return classify_failure(inner)
        return RemoteFailure("raised", exc, "ActorInitError", str(exc))
    if isinstance(
        exc,
        (
            _exc.RayActorError,
            _exc.ActorUnavailableError,
            _exc.WorkerCrashedError,
            _exc.NodeDiedError,
        ),
    ):
        return RemoteFailure("died", exc, type(exc).__name__, str(exc))
    if isinstance(exc, _exc.RayTaskError):
        cause = exc.cause if isinstance(exc.cause, BaseException) else exc
        tb = str(getattr(exc, "traceback_str", "") or str(exc))
        return RemoteFailure("raised", cause, type(cause).__name__, tb)
    return RemoteFailure("other", exc, type(exc).__name__, str(exc))


def monotonic() -> float:
    """``time.monotonic()`` (kept here so tests can see one clock)."""
    return time.monotonic()


def unwrap_remote_class(cls: object) -> type:
    """The Python class behind ``ray.remote(cls)`` (``cls`` itself if it is not wrapped)."""
    inner = getattr(cls, "__ray_actor_class__", None)
    if isinstance(inner, type):
        return inner
    if isinstance(cls, type):
        return cls
    raise TypeError(f"expected a class or a ray.remote class, got {type(cls).__qualname__}")


def is_remote_class(cls: object) -> bool:
    """Whether ``cls`` is a class wrapped by ``ray.remote``."""
    return isinstance(cls, ray.actor.ActorClass)


def _probe_placement_group(instance: object) -> str | None:
    found = ray.get_runtime_context().get_placement_group_id()
    return None if found is None else str(found)


def actor_placement_group(actor: ActorHandle, timeout_s: float | None) -> PlacementGroup | None:
    """The placement group a running actor was scheduled into, or ``None``."""
    ref = cast(Any, actor).__ray_call__.remote(_probe_placement_group)
    hex_id = ray.get(ref, timeout=timeout_s)
    if not hex_id:
        return None
    from ray._raylet import PlacementGroupID

    return cast("PlacementGroup", _pg_mod.PlacementGroup(PlacementGroupID(bytes.fromhex(hex_id))))


def _probe_actor(instance: object) -> tuple[str, str | None]:
    import os

    return str(ray.get_runtime_context().get_node_id()), os.environ.get("CUDA_VISIBLE_DEVICES")


def actor_node_and_devices(actor: ActorHandle, timeout_s: float | None) -> tuple[str, str | None]:
    """The node id and ``CUDA_VISIBLE_DEVICES`` of a running actor, whatever its class."""
    ref = cast(Any, actor).__ray_call__.remote(_probe_actor)
    node, devices = ray.get(ref, timeout=timeout_s)
    return str(node), (None if devices is None else str(devices))


def call_in_actor(
    actor: ActorHandle, fn: Callable[..., Any], args: Sequence[Any] = ()
) -> ObjectRef:
    """Run ``fn(actor_instance, *args)`` inside the actor (Ray's ``__ray_call__``)."""
    return cast("ObjectRef", cast(Any, actor).__ray_call__.remote(fn, *args))


# --- starting and stopping clusters (tests, benchmarks, scripts) -------------------------


def init_local(
    num_cpus: int,
    num_gpus: int | None = None,
    resources: Mapping[str, float] | None = None,
    namespace: str | None = None,
    object_store_memory: int | None = None,
) -> None:
    """Start a new local single-node cluster (quiet: no dashboard, worker logs not
    forwarded), even if another cluster runs on this machine.

    Ray's ``uv run`` integration (a driver started by ``uv run`` makes every worker start
    through ``uv run`` in a packaged copy of the working directory) is switched off: the
    workers use this interpreter's environment directly, which starts them much faster.
    """
    disable_uv_run_propagation()
    ray.init(
        address="local",  # always a new cluster, never one another process started here
        num_cpus=num_cpus,
        num_gpus=num_gpus,
        resources=dict(resources) if resources else None,
        namespace=namespace,
        object_store_memory=object_store_memory,
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )


def disable_uv_run_propagation() -> None:
    """Switch off Ray's ``uv run`` runtime-env hook for clusters this process starts
    (same as ``RAY_ENABLE_UV_RUN_RUNTIME_ENV=0`` before importing ray)."""
    from ray._private import ray_constants

    cast(Any, ray_constants).RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def shutdown() -> None:
    """Disconnect from the cluster (and stop it if this process started it)."""
    ray.shutdown()


class SimulatedCluster:
    """Several Ray nodes on this machine (``ray.cluster_utils.Cluster``), for tests."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        self._cluster: Any = Cluster()

    def add_node(
        self, num_cpus: int, num_gpus: int = 0, resources: Mapping[str, float] | None = None
    ) -> str:
        """Add a node and return its node id."""
        node = self._cluster.add_node(
            num_cpus=num_cpus,
            num_gpus=num_gpus,
            resources=dict(resources) if resources else None,
            include_dashboard=False,
        )
        return str(node.node_id)

    def connect(self, namespace: str | None = None) -> None:
        """Connect this process as the driver."""
        self._cluster.wait_for_nodes()
        disable_uv_run_propagation()
        ray.init(
            address=self._cluster.address,
            namespace=namespace,
            log_to_driver=False,
            configure_logging=False,
        )

    def shutdown(self) -> None:
        """Disconnect and stop every node."""
        ray.shutdown()
        self._cluster.shutdown()


def actor_state(actor: ActorHandle) -> str:
    """``ALIVE``, ``PENDING_CREATION``, ``RESTARTING``, ``DEAD`` (or ``UNKNOWN``)."""
    from ray._private import state as _state

    try:
        raw = cast("dict[str, Any]", _state.actors(actor_id=actor_id(actor)))
    except Exception:
        return "UNKNOWN"
    return str(raw.get("State", "UNKNOWN")) if raw else "UNKNOWN"


def ready_ref(actor: ActorHandle) -> ObjectRef:
    """A reference that is ready once the actor's constructor has finished (or failed)."""
    return cast("ObjectRef", cast(Any, actor).__ray_ready__.remote())


def call_actor_multi(
    actor: ActorHandle,
    method: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    num_returns: int,
) -> list[ObjectRef]:
    """``actor.<method>.options(num_returns=n).remote(...)``: one reference per return."""
    refs = getattr(actor, method).options(num_returns=num_returns).remote(*args, **dict(kwargs))
    if num_returns == 1:
        return [cast("ObjectRef", refs)]
    return [cast("ObjectRef", r) for r in refs]


def remote_class_options(cls: object) -> dict[str, Any]:
    """The options a ``ray.remote(...)`` decorator gave a class (empty for a plain class)."""
    raw = getattr(cls, "_default_options", None)
    return dict(raw) if isinstance(raw, Mapping) else {}
