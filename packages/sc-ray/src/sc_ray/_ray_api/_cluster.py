"""Cluster state, and starting or stopping clusters (tests, benchmarks, scripts)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._base import _cluster_utils, _constants, ray

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
    _constants.RAY_ENABLE_UV_RUN_RUNTIME_ENV = False


def shutdown() -> None:
    """Disconnect from the cluster (and stop it if this process started it)."""
    ray.shutdown()


class SimulatedCluster:
    """Several Ray nodes on this machine (``ray.cluster_utils.Cluster``), for tests."""

    def __init__(self) -> None:
        self._cluster: Any = _cluster_utils.Cluster()
        self._nodes: dict[str, Any] = {}

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
        self._nodes[str(node.node_id)] = node
        return str(node.node_id)

    def remove_node(self, node_id: str) -> None:
        """Lose the node ``node_id`` (not the driver's): its processes are killed without a
        graceful shutdown, so the cluster learns of it through its health checks."""
        self._cluster.remove_node(self._nodes.pop(node_id), allow_graceful=False)

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
