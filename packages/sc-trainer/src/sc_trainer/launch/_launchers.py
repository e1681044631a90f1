"""Launchers: what builds a run's pools and worker groups on one backend, Ray or in-process.

The trainer is written once against the verl-named API (resource pool manager, class with
init args, colocated worker class, worker group with ``spawn``); a :class:`Launcher`
supplies one backend's versions of those pieces and starts and stops what that backend
needs (a local Ray cluster). The pieces are typed by the worker class
(``worker_group(pool, ClassWithInitArgs[W]) -> WorkerGroup[W]``), so the trainer's calls are
checked (``sc_core.mypy_plugin``). :class:`InProcessLauncher` uses sc-core's
``ResourcePoolManager`` as it is, :class:`RayLauncher` sc-ray's specialisation of it; a
piece of one backend given to the other's launcher is a :class:`BackendMismatchError`.
:class:`DetachedRayLauncher` builds a detached run's pieces (``TrainerConfig.run``), that a
new driver re-attaches to when this one dies.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import torch
from sc_core import (
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    ResourcePoolManager,
    Worker,
    WorkerGroup,
    create_colocated_worker_cls,
)

from .._errors import BackendMismatchError, TrainerConfigError
from .._settings import WORKER_LOGS
from ..config import TrainerConfig
from ..runs import AttachedDriver
from ..trainer import Launcher
from ._connect import connect_to_cluster, prepare_ray_environment

__all__ = [
    "DetachedRayLauncher",
    "InProcessLauncher",
    "RayLauncher",
    "make_launcher",
    "teardown_detached_run",
]

logger = logging.getLogger(__name__)

W = TypeVar("W")

#: Environment of every worker process: one intra-op thread each (the machine is small and
#: shared; several single-threaded workers beat one oversubscribed pool).
WORKER_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


class RayLauncher:
    """Builds Ray actors in placement groups (sc-ray); starts a local cluster unless one is
    running."""

    name = "ray"
    driver: AttachedDriver | None = None

    def __init__(self, num_cpus: int, use_gpu: bool = False, standby: int = 0) -> None:
        self.num_cpus = num_cpus
        #: each worker process gets one GPU (Ray finds the machine's GPUs itself)
        self.use_gpu = use_gpu
        #: spare actors per worker group, that take over a dead rank (sc_ray's standby)
        self.standby = standby

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
                address="local",  # a new cluster, never one `ray start` left on this machine
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
    ) -> ResourcePoolManager:
        from sc_ray import ResourcePoolManager as RayResourcePoolManager

        return RayResourcePoolManager(spec, mapping, use_gpu=self.use_gpu)

    def class_with_init(self, cls: type[W], **kwargs: Any) -> ClassWithInitArgs[W]:
        from sc_ray import RayClassWithInitArgs

        # A plain class: sc-ray makes it a Ray actor class when it creates the actors.
        return RayClassWithInitArgs(cls, **kwargs)

    def create_colocated_worker_cls(
        self, class_dict: Mapping[str, ClassWithInitArgs[Any]]
    ) -> ClassWithInitArgs[Worker]:
        from sc_ray import create_colocated_worker_cls

        return create_colocated_worker_cls(class_dict=dict(class_dict))

    def worker_group(
        self, pool: ResourcePool, cls: ClassWithInitArgs[W], name: str = "workers"
    ) -> WorkerGroup[W]:
        from sc_ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

        if not isinstance(pool, RayResourcePool):
            raise BackendMismatchError(
                f"RayLauncher.worker_group: pool must be a RayResourcePool (from this launcher's "
                f"resource_pool_manager), got {pool!r}"
            )
        if not isinstance(cls, RayClassWithInitArgs):
            raise BackendMismatchError(
                f"RayLauncher.worker_group: cls must be a RayClassWithInitArgs (from this "
                f"launcher's class_with_init), got {cls!r}"
            )
        group: WorkerGroup[W] = RayWorkerGroup(
            resource_pool=pool,
            ray_cls_with_init=cls,
            worker_env=dict(WORKER_ENV),
            standby=self.standby,
        )
        return group


class InProcessLauncher:
    """Builds every worker in this process (sc-core's in-process backend), world size 1 per
    role."""

    name = "local"
    driver: AttachedDriver | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            yield
        finally:
            torch.set_num_threads(threads)

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> ResourcePoolManager:
        return ResourcePoolManager(spec, mapping)

    def class_with_init(self, cls: type[W], **kwargs: Any) -> ClassWithInitArgs[W]:
        return ClassWithInitArgs(cls, **kwargs)

    def create_colocated_worker_cls(
        self, class_dict: Mapping[str, ClassWithInitArgs[Any]]
    ) -> ClassWithInitArgs[Worker]:
        return create_colocated_worker_cls(class_dict=dict(class_dict))

    def worker_group(
        self, pool: ResourcePool, cls: ClassWithInitArgs[W], name: str = "workers"
    ) -> WorkerGroup[W]:
        return LocalWorkerGroup(resource_pool=pool, cls_with_init=cls)


class DetachedRayLauncher:
    """Builds a detached run's pools and worker groups on a standing Ray cluster.

    It connects in the run's namespace and creates the run (sc-ray's ``RayRun.create``), or
    re-attaches to it when it exists (``RayRun.attach``: the lease, the epoch, the checks).
    The pools and worker groups are the run's: detached, named from the run id, and on
    re-attach rebuilt over the live actors without starting or re-initialising any of them;
    with ``standby`` (``TrainerConfig.standby``) each group's spares are the run's too, and
    a driver that re-attaches adopts the live ones. ``driver`` (:class:`AttachedDriver`) is set
    while :meth:`running`."""

    name = "ray"

    def __init__(self, config: TrainerConfig) -> None:
        if config.run.id is None:
            raise BackendMismatchError("DetachedRayLauncher: the configuration has no run id")
        self.run_id: str = config.run.id
        self.address = config.run.address
        self.abandon_s = config.run.abandon_s
        self.attach_only = config.run.attach
        self.use_gpu = config.device == "cuda"
        #: spare actors per worker group (sc_ray's standby), adopted on re-attach
        self.standby = config.standby
        self.folder = Path(config.output_dir)
        self.driver: AttachedDriver | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Connect to the cluster in the run's namespace, create or re-attach to the run;
        on leaving, tear the run down if the body finished, else leave it for a new driver
        (its workers keep running; the lease is given up at once)."""
        prepare_ray_environment()  # before sc-ray imports Ray
        from sc_ray import RayRun, UnknownRunError, run_namespace

        ray = connect_to_cluster(
            self.address, namespace=run_namespace(self.run_id), log_to_driver=WORKER_LOGS.get()
        )
        try:
            try:
                run = RayRun.attach(self.run_id)
            except UnknownRunError:
                if self.attach_only:
                    raise
                run = RayRun.create(self.run_id, abandon_after_s=self.abandon_s)
            self.driver = AttachedDriver(run, self.folder)
            logger.warning(
                "run %s: %s (epoch %d)",
                self.run_id,
                "re-attached" if run.attached else "created",
                run.epoch,
            )
            try:
                yield
            except BaseException:
                run.release()
                logger.warning(
                    "run %s: the driver stops; the workers keep running: give the same command "
                    "to re-attach, or tear the run down with sc-demo --teardown %s",
                    self.run_id,
                    self.run_id,
                )
                raise
            run.teardown()
        finally:
            self.driver = None
            ray.shutdown()

    def _run(self) -> Any:
        if self.driver is None:
            raise BackendMismatchError("DetachedRayLauncher: used outside running()")
        return self.driver.run

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> Any:
        from sc_ray import RayResourcePoolManager

        run = self._run()
        use_gpu = self.use_gpu

        class RunPoolManager(RayResourcePoolManager):
            """The run's pools: detached placement groups named from the run id, found
            again on re-attach."""

            def _new_pool(self, name: str, process_on_nodes: list[int]) -> Any:
                return run.resource_pool(name, process_on_nodes, use_gpu=use_gpu)

            def _check_resource_available(self) -> None:
                if not run.attached:  # a re-attached run holds its reservations already
                    super()._check_resource_available()

        return RunPoolManager(spec, mapping, use_gpu=use_gpu, device_name="cuda")

    # the classes are those of a launcher that is not detached
    class_with_init = RayLauncher.class_with_init
    create_colocated_worker_cls = RayLauncher.create_colocated_worker_cls

    def worker_group(
        self, pool: ResourcePool, cls: ClassWithInitArgs[W], name: str = "workers"
    ) -> WorkerGroup[W]:
        group: WorkerGroup[W] = self._run().worker_group(
            name, pool, cls, worker_env=dict(WORKER_ENV), standby=self.standby
        )
        return group


def make_launcher(config: TrainerConfig) -> Launcher:
    """The launcher of the backend ``config.backend`` names (``"ray"``: :class:`RayLauncher`,
    or the detached run's ``DetachedRayLauncher`` with ``config.run.id``; ``"local"``:
    :class:`InProcessLauncher`); ``device="cuda"`` needs a visible CUDA device."""
    if config.device == "cuda" and not torch.cuda.is_available():
        raise TrainerConfigError(
            "make_launcher: device='cuda' but no CUDA device is visible "
            "(torch.cuda.is_available() is False); use device='cpu'"
        )
    if config.backend == "ray" and config.run.detached:
        return DetachedRayLauncher(config)
    if config.backend == "ray":
        return RayLauncher(
            config.ray_num_cpus, use_gpu=config.device == "cuda", standby=config.standby
        )
    if config.backend == "local":
        return InProcessLauncher()
    raise TrainerConfigError(f"make_launcher: unknown backend {config.backend!r}")


def teardown_detached_run(run_id: str, address: str | None) -> Any:
    """Release every actor and placement group of run ``run_id`` (``sc-demo --teardown``);
    sc-ray's ``RunInfo`` of what was released."""
    prepare_ray_environment()  # before sc-ray imports Ray
    from sc_ray import run_namespace, teardown_run

    ray = connect_to_cluster(address, namespace=run_namespace(run_id), log_to_driver=False)
    try:
        return teardown_run(run_id)
    finally:
        ray.shutdown()
