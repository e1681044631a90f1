"""What happens when a worker dies, and the faults that test it.

:class:`Recovery` brings a run back in place after a worker's death (new processes, or a
standby's, and the newest checkpoint restored); :class:`FaultSpec` (``--inject-fault
actor:1@step=30``) kills or breaks a worker rank on purpose, :class:`DriverFault`
(``driver@step=3:update_actor+0.2``) kills a detached run's driver, :class:`NodeFault`
(``node@step=3:update_actor+0.5``) loses a whole node of a run on Ray, :class:`RewardFault`
(``reward:3@step=2:hang``) makes one call of the reward function fail; :class:`InjectedFaults`
holds a run's faults of every kind for the trainer. What survives the driver
itself is in :mod:`sc_trainer.runs`.
"""

from sc_dispatch import _public

from .._errors import TrainerRecoveryError
from ._driver import DRIVER_PHASES, DriverFault, DriverFaults
from ._injected import InjectedFaults
from ._node import ArmedLoss, NodeFault, NodeFaults
from ._recovery import LOST_PEER_MARKS, Recovery, lost_peer, replace_dead, wait_for_dead
from ._reward import REWARD_ACTIONS, RewardFault, RewardFaults
from ._workers import FAULT_ROLES, FaultSpec, FaultTargets, ServerTargets, inject_due

__all__ = [
    "ArmedLoss",
    "DRIVER_PHASES",
    "DriverFault",
    "DriverFaults",
    "FAULT_ROLES",
    "FaultSpec",
    "FaultTargets",
    "InjectedFaults",
    "LOST_PEER_MARKS",
    "NodeFault",
    "NodeFaults",
    "REWARD_ACTIONS",
    "Recovery",
    "RewardFault",
    "RewardFaults",
    "ServerTargets",
    "TrainerRecoveryError",
    "inject_due",
    "lost_peer",
    "replace_dead",
    "wait_for_dead",
]

_public.publish(globals())
