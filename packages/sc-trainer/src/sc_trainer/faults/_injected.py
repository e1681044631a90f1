"""The faults a run injects on purpose, held by the trainer as one object: the worker faults
(``--inject-fault``), the driver's and the node losses, and the task's reward faults; each
fires once."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

from .._errors import TrainerStateError
from ._driver import DriverFault, DriverFaults
from ._node import ArmedLoss, NodeFault, NodeFaults
from ._reward import RewardFaults
from ._workers import FaultSpec, FaultTargets, ServerTargets, inject_due

__all__ = ["InjectedFaults"]


class InjectedFaults:
    """A run's injected faults: ``workers`` (each injected once at its step), the driver's
    faults of the ``inject_fault`` text (:class:`DriverFault`, a detached run's re-attach
    tests) and ``nodes`` (:class:`NodeFault`, a lost node)."""

    def __init__(
        self, workers: Sequence[FaultSpec], inject_fault: str | None, nodes: Sequence[NodeFault]
    ) -> None:
        self._workers: list[FaultSpec] = list(workers)
        self._driver = DriverFaults(DriverFault.parse_all(inject_fault))
        self._nodes = NodeFaults(tuple(nodes))

    @contextlib.contextmanager
    def phase(self, step: int, phase: str) -> Iterator[None]:
        """Phase ``phase`` of step ``step``: where a fault loses a node or kills the driver."""
        with self._driver.phase(step, phase), self._nodes.phase(step, phase):
            yield

    def at_start(self, step: int) -> None:
        """Step ``step`` begins (not a recovery's redo): a driver fault of its start fires."""
        self._driver.at(step, "start")

    def inject(
        self, step: int, targets: FaultTargets, task: Any, servers: ServerTargets | None
    ) -> None:
        """Inject the faults whose step begins: arm the step's node faults (and lose the node
        of those that name no phase) and the task's reward faults, and break or kill the
        worker ranks (and engine servers) of the step's worker faults."""
        self._nodes.arm(step, lambda fault: _node_loss(targets, fault))
        reward_faults = getattr(task, "reward_faults", None)
        if isinstance(reward_faults, RewardFaults):
            reward_faults.arm(step)
        if any(f.step == step for f in self._workers):
            self._workers = inject_due(targets, self._workers, step, servers)

    def close(self) -> None:
        """Disarm the node losses armed and never fired."""
        self._nodes.close()


def _node_loss(targets: FaultTargets, fault: NodeFault) -> ArmedLoss:
    """Arm ``fault``: sc-ray's ``NodeLoss`` on the node of its actor rank."""
    from sc_ray import NodeLoss, NodeLossError, RayWorkerGroup

    group = targets.actor_rollout
    if not isinstance(group, RayWorkerGroup):
        raise TrainerStateError(
            f"inject_fault {fault}: losing a node needs the Ray backend's worker groups, "
            f"not {type(group).__name__}"
        )
    try:
        return NodeLoss.of_rank(group, fault.rank)
    except NodeLossError as exc:
        raise TrainerStateError(f"inject_fault {fault}: {exc}") from exc
