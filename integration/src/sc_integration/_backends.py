"""Where the worker groups live: Ray actors, or objects in this process.

The trainer is written once against the verl-named API (resource pool manager, class with
init args, colocated worker class, worker group with ``spawn``); a :class:`WorkerBackend`
supplies the backend's versions of those pieces and starts and stops what it needs.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from ._config import TrainerConfig
from ._errors import TrainerConfigError
from ._settings import WORKER_LOGS

__all__ = ["LocalBackend", "RayBackend", "WorkerBackend", "make_backend"]

logger = logging.getLogger(__name__)

#: Environment of every worker process: one intra-op thread each (the machine is small and
#: shared; several single-threaded workers beat one oversubscribed pool).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class WorkerBackend(Protocol):
    """What the trainer needs from a backend."""

    name: str

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Start what the backend needs for the duration of the ``with`` block."""

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> Any:
        """A manager with ``create_resource_pool()`` and ``get_resource_pool(role)``."""

    def class_with_init(self, cls: type, **kwargs: Any) -> Any:
        """The backend's ``ClassWithInitArgs`` for ``cls(**kwargs)``."""

    def create_colocated_worker_cls(self, class_dict: Mapping[str, Any]) -> Any:
        """One class holding every role of ``class_dict`` (one process per rank)."""

    def worker_group(self, pool: Any, cls_with_init: Any) -> Any:
        """A worker group of ``cls_with_init`` on ``pool``."""

    def close_group(self, group: Any) -> None:
        """Stop the workers of ``group`` (and release its resources)."""


class RayBackend:
    """Ray actors in placement groups; starts a local cluster unless one is running."""

    name = "ray"

    def __init__(self, num_cpus: int) -> None:
        self.num_cpus = num_cpus

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        # Under `uv run`, Ray would start every worker through `uv run` in a copy of the
        # working directory; the driver's interpreter already has everything the workers
        # import. Ray reads this once, when it is first imported.
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        import ray

        started = False
        if not ray.is_initialized():
            logger.info("starting a local Ray cluster with %d CPUs", self.num_cpus)
            ray.init(
                num_cpus=self.num_cpus,
                include_dashboard=False,
                log_to_driver=WORKER_LOGS.get(),
            )
            started = True
        try:
            yield
        finally:
            if started:
                ray.shutdown()

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> Any:
        from sc_ray import ResourcePoolManager

        return ResourcePoolManager(spec, mapping, use_gpu=False)

    def class_with_init(self, cls: type, **kwargs: Any) -> Any:
        import ray
        from sc_ray import RayClassWithInitArgs

        return RayClassWithInitArgs(ray.remote(cls), **kwargs)

    def create_colocated_worker_cls(self, class_dict: Mapping[str, Any]) -> Any:
        from sc_ray import create_colocated_worker_cls

        return create_colocated_worker_cls(class_dict=dict(class_dict))

    def worker_group(self, pool: Any, cls_with_init: Any) -> Any:
        from sc_ray import RayWorkerGroup

        return RayWorkerGroup(
            resource_pool=pool, ray_cls_with_init=cls_with_init, worker_env=dict(WORKER_ENV)
        )

    def close_group(self, group: Any) -> None:
        group.shutdown()


class _LocalPoolManager:
    """The in-process counterpart of sc-ray's ``ResourcePoolManager``."""

    def __init__(self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]) -> None:
        self.spec = {k: list(v) for k, v in spec.items()}
        self.mapping = dict(mapping)
        self.pools: dict[str, Any] = {}

    def create_resource_pool(self) -> None:
        from sc_core import ResourcePool

        self.pools = {name: ResourcePool(counts) for name, counts in self.spec.items()}

    def get_resource_pool(self, role: Any) -> Any:
        return self.pools[self.mapping[role]]


class LocalBackend:
    """Every worker in this process (sc-core's in-process backend), world size 1 per role."""

    name = "local"

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        import torch

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> Any:
        return _LocalPoolManager(spec, mapping)

    def class_with_init(self, cls: type, **kwargs: Any) -> Any:
        from sc_core import ClassWithInitArgs

        return ClassWithInitArgs(cls, **kwargs)

    def create_colocated_worker_cls(self, class_dict: Mapping[str, Any]) -> Any:
        from sc_core import create_colocated_worker_cls

        return create_colocated_worker_cls(class_dict=dict(class_dict))

    def worker_group(self, pool: Any, cls_with_init: Any) -> Any:
        from sc_core import LocalWorkerGroup

        return LocalWorkerGroup(resource_pool=pool, ray_cls_with_init=cls_with_init)

    def close_group(self, group: Any) -> None:
        group.close()


def make_backend(config: TrainerConfig) -> WorkerBackend:
    """The backend ``config.backend`` names."""
    if config.backend == "ray":
        return RayBackend(config.ray_num_cpus)
    if config.backend == "local":
        return LocalBackend()
    raise TrainerConfigError(f"make_backend: unknown backend {config.backend!r}")
