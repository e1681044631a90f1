"""The configuration of a detached run: a run id, the standing cluster, the abandon timeout.

``TrainerConfig.run`` (``sc-demo --run-id ID --address ADDR``) runs the job *detached*: its
pools and worker groups are created on a standing Ray cluster under names derived from the
run id (sc-ray's ``RayRun``), so they outlive the driver; the same command, given again,
re-attaches a new driver to the live workers and finishes the run
(:class:`~sc_trainer.launch.DetachedRayLauncher`, :class:`~sc_trainer.runs.AttachedDriver`).
Without a run id nothing changes: the run starts a local cluster that dies with it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from .._errors import TrainerConfigError
from ..faults import DriverFault
from ._options import option

__all__ = ["RUN_ID_PATTERN", "RunConfig", "check_detached", "check_run_id"]

#: What a run id may look like (sc-ray's rule: it names a Ray namespace and actors).
RUN_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")

#: Seconds a detached run waits for a driver to re-attach before it releases itself.
DEFAULT_ABANDON_S = 600.0


def check_run_id(where: str, run_id: object) -> str:
    """``run_id`` if it is a valid run id, else :class:`TrainerConfigError` naming it."""
    if not isinstance(run_id, str) or RUN_ID_PATTERN.match(run_id) is None:
        raise TrainerConfigError(
            f"{where}: a run id is 1 to 64 letters, digits, '_', '.' or '-', starting with a "
            f"letter or digit; got {run_id!r}"
        )
    return run_id


@dataclass(frozen=True)
class RunConfig:
    """How a run lives on a standing Ray cluster (``id=None``: it does not; the default).

    ``id`` names the run: its worker groups and placement groups are detached and named from
    it, and a driver started again with the same id (and the same configuration) re-attaches
    to them instead of starting workers. ``address`` is the cluster's (``None``: Ray's
    ``"auto"``, which finds ``RAY_ADDRESS`` or a cluster started on this machine with ``ray
    start --head``). ``abandon_s``: a run whose driver is gone and has not re-attached for
    that long releases its workers and placement groups itself. ``attach``: only
    re-attach; a run id that names no run is an error instead of a new run.
    """

    id: str | None = field(
        default=None,
        metadata=option(
            group="fault tolerance",
            flags=("--run-id",),
            metavar="ID",
            help="run detached on a standing Ray cluster under this id: the workers outlive "
            "this driver, and the same command given again re-attaches to them and resumes "
            "the step in flight exactly once",
            default_text="not detached: a local cluster that ends with this process",
        ),
    )
    address: str | None = field(
        default=None,
        metadata=option(
            group="fault tolerance",
            flags=("--address",),
            metavar="ADDR",
            help="the standing Ray cluster of a --run-id run (host:port of `ray start --head`)",
            default_text="RAY_ADDRESS, else a cluster started on this machine",
        ),
    )
    abandon_s: float = field(
        default=DEFAULT_ABANDON_S,
        metadata=option(
            group="fault tolerance",
            flags=("--run-abandon-s",),
            metavar="S",
            help="a --run-id run whose driver is gone releases its workers after S seconds "
            "without a re-attach",
        ),
    )
    attach: bool = field(
        default=False,
        metadata=option(
            group="fault tolerance",
            flags=("--attach",),
            help="with --run-id: only re-attach to the run (an unknown run id is an error)",
        ),
    )

    def __post_init__(self) -> None:
        if self.id is not None:
            check_run_id("RunConfig.id", self.id)
        elif self.attach or self.address is not None:
            raise TrainerConfigError(
                "RunConfig: --attach and --address apply to a detached run; give --run-id"
            )
        abandon = self.abandon_s
        if isinstance(abandon, bool) or not isinstance(abandon, (int, float)) or not abandon > 0:
            raise TrainerConfigError(f"RunConfig.abandon_s must be > 0 seconds, got {abandon!r}")
        if self.address is not None and not self.address.strip():
            raise TrainerConfigError("RunConfig.address must not be empty")

    @property
    def detached(self) -> bool:
        """Whether the run lives detached on a standing cluster (it has an id)."""
        return self.id is not None


def check_detached(
    run: RunConfig,
    *,
    backend: str,
    rollout_engine: str,
    standby: int,
    resume_from: str | None,
    inject_fault: str | None,
) -> None:
    """What a detached run (``run.id``) needs of the rest of ``TrainerConfig`` (its fields
    given by keyword), and what only a detached run may ask (killing its driver):
    :class:`TrainerConfigError` otherwise. Every ``rollout_engine`` and ``standby`` runs
    detached (kept as parameters for the callers): engine servers (builtin or vllm) are the
    run's, and so are standby spares; a driver that re-attaches adopts both."""
    owner = "TrainerConfig"
    driver_faults = DriverFault.parse_all(inject_fault)
    if not run.detached:
        if driver_faults:
            raise TrainerConfigError(
                f"{owner}.inject_fault={inject_fault!r}: killing the driver ends a run "
                "unless it is detached; give run.id (--run-id) to run it on a standing cluster"
            )
        return
    why = None
    if backend != "ray":
        why = f"backend={backend!r} (a detached run lives on a standing Ray cluster)"
    elif resume_from is not None:
        why = "resume_from (a detached run resumes by re-attaching to its workers)"
    if why is not None:
        raise TrainerConfigError(f"{owner}: run.id={run.id!r} cannot run with {why}")
