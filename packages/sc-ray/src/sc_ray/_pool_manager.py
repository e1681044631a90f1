"""sc-ray's ``ResourcePoolManager``: sc-core's manager building :class:`RayResourcePool` s.

It specialises the two hooks of :class:`sc_core.ResourcePoolManager`: each pool is a
``RayResourcePool`` (placed on first use, one placement group per node), and
:meth:`~RayResourcePoolManager.create_resource_pool` first checks that the cluster's alive
nodes have the accelerators (or CPUs, for ``use_gpu=False``) every pool asks, failing at
once with :class:`InsufficientResourcesError` instead of waiting for a placement that can
never happen.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from sc_core import ResourcePoolManager

from . import _ray_api as rapi
from ._errors import InsufficientResourcesError, RayResourcePoolError
from ._resource_pool import DEVICE_RESOURCE, RayResourcePool, check_device_name

__all__ = ["RayResourcePoolManager"]


class RayResourcePoolManager(ResourcePoolManager[RayResourcePool]):
    """Named Ray pools and the roles that use them (exported as ``sc_ray.ResourcePoolManager``,
    verl's name).

    ``resource_pool_spec`` maps a pool name to processes per node (``{"global_pool": [8,
    8]}``); ``mapping`` maps a role to a pool name. Each pool is a :class:`RayResourcePool`
    with ``use_gpu``, ``max_colocate_count``, ``device_name``, ``placement_timeout_s`` and
    ``n_gpus_per_node`` as given here. :meth:`create_resource_pool` first checks that the
    cluster has the accelerators (or CPUs, with ``use_gpu=False``) the pools ask for, in
    all and per node (:class:`InsufficientResourcesError`); :meth:`release` removes every
    pool's placement groups.
    """

    pool_class = RayResourcePool
    error_class = RayResourcePoolError

    def __init__(
        self,
        resource_pool_spec: Mapping[str, Sequence[int]],
        mapping: Mapping[Any, str],
        *,
        use_gpu: bool = True,
        max_colocate_count: int = 1,
        device_name: str = "cuda",
        placement_timeout_s: float | None = None,
        n_gpus_per_node: int = 8,
    ) -> None:
        super().__init__(
            resource_pool_spec,
            mapping,
            max_colocate_count=max_colocate_count,
            n_gpus_per_node=n_gpus_per_node,
        )
        self.use_gpu = bool(use_gpu)
        self.device_name = check_device_name(type(self).__name__, device_name, self.use_gpu)
        self.placement_timeout_s = placement_timeout_s

    def _new_pool(self, name: str, process_on_nodes: list[int]) -> RayResourcePool:
        return RayResourcePool(
            process_on_nodes=process_on_nodes,
            use_gpu=self.use_gpu,
            max_colocate_count=self.max_colocate_count,
            name_prefix=f"{name}_{uuid.uuid4().hex[:6]}_",
            device_name=self.device_name,
            placement_timeout_s=self.placement_timeout_s,
            n_gpus_per_node=self.n_gpus_per_node,
        )

    def _check_resource_available(self) -> None:
        """The cluster's alive nodes must have the processes' devices (or CPUs) in all, and
        every pool's per-node count must fit a node (checked greedily, largest first)."""
        where = type(self).__name__
        resource = DEVICE_RESOURCE[self.device_name] if self.use_gpu else "CPU"
        per_node = sorted(
            (n.resources.get(resource, 0.0) for n in rapi.list_nodes() if n.alive), reverse=True
        )
        total_have = sum(per_node)
        need = self.get_n_gpus()
        if total_have < need:
            raise InsufficientResourcesError(
                f"{where}: pools {self.resource_pool_spec} ask {need} {resource} in all, the "
                f"cluster has {total_have:g} (per node: {per_node})"
            )
        free = list(per_node)
        for name, counts in self.resource_pool_spec.items():
            for count in sorted(counts, reverse=True):
                free.sort(reverse=True)
                if not free or free[0] < count:
                    raise InsufficientResourcesError(
                        f"{where}: pool {name!r} needs {count} {resource} on one node; the "
                        f"nodes have {per_node} (free after other pools: {free})"
                    )
                free[0] -= count

    def release(self) -> None:
        """Remove every pool's placement groups (killing whatever still runs in them)."""
        for pool in self.resource_pool_dict.values():
            pool.release()
