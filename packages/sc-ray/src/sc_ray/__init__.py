"""sc-ray: the Ray backend of sc.

verl's Ray layer under the same names: :class:`RayResourcePool` (one placement group per
node, ordered by node IP), :class:`RayClassWithInitArgs`, :class:`RayWorkerGroup`,
:class:`ResourcePoolManager` (sc-core's manager building Ray pools, also named
:class:`RayResourcePoolManager`), colocated and fused worker classes (the raw fused class to
subclass too), split and merge of pools, :func:`parallel_put`, runs that outlive their driver
(:class:`RayRun`, :func:`teardown_run`), and :class:`NodeLoss` (a whole node lost on purpose,
for fault-injection tests).
Ray's loosely typed API is confined to one private module; importing ``sc_ray`` does not
import torch or sc-protocol (they are imported when a DataProto is handled).
"""

from sc_dispatch import _public

from ._adapters import register_adapters
from ._class_with_init import RayClassWithInitArgs
from ._colocate import (
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
)
from ._errors import (
    DetachedWorkerError,
    InsufficientResourcesError,
    NodeLossError,
    PlacementTimeoutError,
    RankPlacementTimeoutError,
    RayResourcePoolError,
    RunExistsError,
    RunIdError,
    RunInUseError,
    RunMismatchError,
    ScRayError,
    UnknownRunError,
    WorkerEnvError,
)
from ._futures import RayFuture
from ._node_loss import NodeLoss
from ._pool_manager import RayResourcePoolManager
from ._put import parallel_put
from ._resource_pool import PLACEMENT_TIMEOUT_ENV, RayResourcePool, sort_placement_group_by_node_ip
from ._run import RayRun
from ._run_names import run_namespace
from ._run_teardown import RunInfo, teardown_run
from ._settings import SETTINGS
from ._sub_pool import SubRayResourcePool, merge_resource_pool, split_resource_pool
from ._worker_group import RESERVED_ENV_VARS, RayWorkerGroup

register_adapters()

#: verl's name: sc-ray's specialisation of :class:`sc_core.ResourcePoolManager`.
ResourcePoolManager = RayResourcePoolManager

__version__ = "0.2.0"

__all__ = [
    "DetachedWorkerError",
    "InsufficientResourcesError",
    "NodeLoss",
    "NodeLossError",
    "PLACEMENT_TIMEOUT_ENV",
    "PlacementTimeoutError",
    "RESERVED_ENV_VARS",
    "RankPlacementTimeoutError",
    "RayClassWithInitArgs",
    "RayFuture",
    "RayResourcePool",
    "RayResourcePoolError",
    "RayResourcePoolManager",
    "RayRun",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "RunExistsError",
    "RunIdError",
    "RunInUseError",
    "RunInfo",
    "RunMismatchError",
    "SETTINGS",
    "ScRayError",
    "SubRayResourcePool",
    "UnknownRunError",
    "WorkerEnvError",
    "__version__",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "parallel_put",
    "run_namespace",
    "sort_placement_group_by_node_ip",
    "split_resource_pool",
    "teardown_run",
]

_public.publish(globals())
