"""Detached runs: a driver that can die and a new one that re-attaches (``TrainerConfig.run``).

:class:`DetachedRayLauncher` connects to a standing Ray cluster in the run's namespace and
creates the run (sc-ray's ``RayRun.create``), or re-attaches to it when it exists
(``RayRun.attach``: the lease, the epoch, the checks). Its pools and worker groups are the
run's: detached, named from the run id, and on re-attach rebuilt over the live actors
without starting or re-initialising any of them.

:class:`RunSession` is the driver's side of exactly-once: one sc-core ``CallIds`` (the run's
epoch) shared by every worker group, one call scope per step begun (and one per prefetched
generation), and the run state written atomically as each step begins
(``_run_state.py``). A re-attached driver replays the interrupted step under the same
scopes: every call the workers already ran is answered from their journals.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from sc_core import (
    CallIds,
    ClassWithInitArgs,
    ResourcePool,
    WorkerDiedError,
    WorkerGroup,
)

from ._config import TrainerConfig
from ._errors import BackendMismatchError
from ._launchers import WORKER_ENV, RayLauncher
from ._run_state import RUN_STATE, RunState, read_run_state, write_run_state
from ._settings import WORKER_LOGS

__all__ = ["DRIVERS_LOG", "DetachedRayLauncher", "RunSession", "teardown"]

logger = logging.getLogger(__name__)

W = TypeVar("W")

#: The file of the output folder that lists each driver of a detached run.
DRIVERS_LOG = "run_drivers.jsonl"


class RunSession:
    """The call ids, call scopes and run state of one driver of a detached run."""

    def __init__(self, run: Any, folder: Path) -> None:
        self.run = run
        self.run_id: str = run.run_id
        #: whether this driver re-attached to a run another driver started
        self.attached: bool = bool(run.attached)
        self.call_ids = CallIds(epoch=int(run.epoch))
        self.folder = folder
        self._scope = 0
        self._replay: int | None = None
        #: the call scope of each prefetched generation, by the step it generates for
        self.launched: dict[int, int] = {}

    def read_state(self) -> RunState | None:
        """The state the previous driver wrote (a re-attached driver reads it once), or
        ``None`` when that driver died before its first step began (while its workers
        built their models). :class:`RunStateNotFoundError` when the output folder is not
        the run's: no driver of it wrote there."""
        if not (self.folder / RUN_STATE).exists() and (self.folder / DRIVERS_LOG).exists():
            return None
        return read_run_state(self.folder, self.run_id)

    def replay_from(self, state: RunState) -> None:
        """Take over ``state``'s step: its scope is the next one :meth:`begin_step` uses,
        and new scopes follow it as they did for the previous driver."""
        self._replay = state.scope
        self._scope = state.scope - 1
        pipeline = state.async_state
        if pipeline is not None and pipeline.launched_step is not None:
            scope = pipeline.launched_scope
            if scope is not None:
                self.launched[pipeline.launched_step] = scope

    def _new_scope(self) -> int:
        self._scope += 1
        return self._scope

    def begin_step(self) -> int:
        """The call scope of the step that begins now (the replayed step's after a
        re-attach); every worker group's calls carry it from here on."""
        scope = self._new_scope()
        if self._replay is not None:
            scope, self._replay = self._replay, None
        self.call_ids.begin(scope)
        return scope

    def launch_scope(self, step: int) -> contextlib.AbstractContextManager[Any]:
        """The scope of the prefetched generation for ``step`` (a new one, or the one the
        previous driver launched it under), for the duration of its call."""
        scope = self.launched.get(step)
        if scope is None:
            scope = self.launched[step] = self._new_scope()
        return self.call_ids.scope(scope)

    def write(self, state: RunState) -> None:
        """Write ``state`` before the step's first call; forget launch scopes it no longer
        names, and let the workers forget journal entries older than what it may replay."""
        write_run_state(self.folder, state)
        keep = state.scope
        pipeline = state.async_state
        if pipeline is not None and pipeline.launched_scope is not None:
            keep = min(keep, pipeline.launched_scope)
        self.launched = {s: c for s, c in self.launched.items() if c >= keep}
        self.call_ids.retain_from(keep)

    def record_driver(self, groups: Sequence[WorkerGroup[Any]]) -> None:
        """Append this driver to ``run_drivers.jsonl``: its epoch, pid, whether it
        re-attached, and the pid of every worker of ``groups`` (a re-attach keeps them)."""
        workers: dict[str, list[int] | None] = {}
        for group in groups:
            try:
                workers[group.name_prefix] = [int(p) for p in group.execute_all_sync("_get_pid")]
            except WorkerDiedError:  # lost while no driver was attached: recovered next
                workers[group.name_prefix] = None
        line = {
            "epoch": self.call_ids.epoch,
            "attached": self.attached,
            "driver_pid": os.getpid(),
            "workers": workers,
        }
        with (self.folder / DRIVERS_LOG).open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True) + "\n")

    def use_on(self, groups: Sequence[WorkerGroup[Any]]) -> None:
        """Every call of ``groups`` carries an id from this session."""
        for group in groups:
            group.use_call_ids(self.call_ids)


class DetachedRayLauncher:
    """Builds the run's pools and worker groups on a standing Ray cluster (see the module
    docstring); ``session`` is set while :meth:`running`."""

    name = "ray"

    def __init__(self, config: TrainerConfig) -> None:
        if config.run.id is None:
            raise BackendMismatchError("DetachedRayLauncher: the configuration has no run id")
        self.run_id: str = config.run.id
        self.address = config.run.address
        self.abandon_s = config.run.abandon_s
        self.attach_only = config.run.attach
        self.use_gpu = config.device == "cuda"
        self.folder = Path(config.output_dir)
        self.session: RunSession | None = None

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Connect to the cluster in the run's namespace, create or re-attach to the run;
        on leaving, tear the run down if the body finished, else leave it for a new driver
        (its workers keep running; the lease is given up at once)."""
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        import ray
        from sc_ray import RayRun, UnknownRunError, run_namespace

        ray.init(
            address=self.address or "auto",
            namespace=run_namespace(self.run_id),
            log_to_driver=WORKER_LOGS.get(),
        )
        try:
            try:
                run = RayRun.attach(self.run_id)
            except UnknownRunError:
                if self.attach_only:
                    raise
                run = RayRun.create(self.run_id, abandon_after_s=self.abandon_s)
            self.session = RunSession(run, self.folder)
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
            self.session = None
            ray.shutdown()

    def _run(self) -> Any:
        if self.session is None:
            raise BackendMismatchError("DetachedRayLauncher: used outside running()")
        return self.session.run

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
            name, pool, cls, worker_env=dict(WORKER_ENV)
        )
        return group


def teardown(run_id: str, address: str | None) -> Any:
    """Release every actor and placement group of run ``run_id`` (``sc-demo --teardown``);
    sc-ray's ``RunInfo`` of what was released."""
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    import ray
    from sc_ray import run_namespace, teardown_run

    ray.init(address=address or "auto", namespace=run_namespace(run_id), log_to_driver=False)
    try:
        return teardown_run(run_id)
    finally:
        ray.shutdown()
