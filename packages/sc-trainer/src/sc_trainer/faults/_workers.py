"""The faults a run injects into itself, to test its recovery: their grammar and injection.

:class:`FaultSpec` (``TrainerConfig.inject_fault``, ``sc-demo --inject-fault
actor:1@step=30``) kills one rank of one role when a step begins
(``WorkerGroup.kill_worker``), or arms a fault that kills the rank (or makes it raise)
inside a named method (``actor:1@step=3:update_actor+0.2``, ``WorkerGroup.inject_fault``);
each fault fires once. Several faults are separated by commas. How the run recovers is the
trainer's business (``RayPPOTrainer._recover`` and :class:`~sc_trainer.faults.Recovery`).
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Any, Protocol, cast

from sc_core import WorkerGroup
from sc_core.ext import FAULT_ACTIONS, FaultAction

from .._errors import TrainerConfigError, TrainerStateError

__all__ = [
    "FAULT_ROLES",
    "FaultSpec",
    "FaultTargets",
    "ServerTargets",
    "inject",
    "inject_due",
    "is_driver_fault",
]

logger = logging.getLogger(__name__)

#: The roles a fault can be injected into (``server``: an engine server of the rollout)
FAULT_ROLES = ("actor", "critic", "rollout", "server")

_SPEC = re.compile(
    r"^(?P<role>[a-z]+):(?P<rank>\d+)@step=(?P<step>\d+)"
    r"(?::(?P<method>[A-Za-z_]\w*)(?:\+(?P<delay>\d+(?:\.\d*)?|\.\d+))?)?"
    r"(?::(?P<action>kill|raise))?$"
)
#: The prefix of a fault that kills the driver itself (``_driver.py``).
DRIVER_PREFIX = "driver@"
#: The prefix of a fault in the reward function (``_reward.py``).
REWARD_PREFIX = "reward:"


def is_driver_fault(text: str) -> bool:
    """Whether one comma-separated part of ``inject_fault`` kills the driver (``driver@...``),
    which ``_driver.py`` parses, rather than a worker."""
    return text.strip().startswith(DRIVER_PREFIX)


_GRAMMAR = "role:rank@step=N[:method[+seconds]][:kill|raise], e.g. 'actor:1@step=30'"


@dataclass(frozen=True)
class FaultSpec:
    """One injected fault: rank ``rank`` of role ``role``'s group, at step ``step``, once.

    Without ``method`` the driver kills the rank as the step begins. With ``method`` the
    fault is armed on the rank as the step begins (``WorkerGroup.inject_fault``) and fires
    when the rank next starts that method: the process exits ``delay_s`` seconds into it
    (``"kill"``: inside the computation, a collective, or a background checkpoint write), or
    the method raises (``"raise"``: an error, which the trainer does not recover from).
    """

    role: str
    rank: int
    step: int
    method: str | None = None
    delay_s: float = 0.0
    action: FaultAction = "kill"

    def __post_init__(self) -> None:
        if self.role not in FAULT_ROLES:
            raise TrainerConfigError(
                f"inject_fault: role must be one of {FAULT_ROLES}, got {self.role!r}"
            )
        if self.rank < 0 or self.step < 1:
            raise TrainerConfigError(
                f"inject_fault: rank must be >= 0 and step >= 1, got rank {self.rank}, "
                f"step {self.step}"
            )
        if self.action not in FAULT_ACTIONS:
            raise TrainerConfigError(
                f"inject_fault: the action must be one of {FAULT_ACTIONS}, got {self.action!r}"
            )
        if self.method is None and (self.delay_s or self.action != "kill"):
            raise TrainerConfigError(
                f"inject_fault: a delay or 'raise' needs a method ({_GRAMMAR})"
            )
        if self.role == "server" and self.method is not None:
            raise TrainerConfigError(
                f"inject_fault: a server fault kills the server's process as step {self.step} "
                f"begins; it takes no method ({self.method!r})"
            )
        if self.action == "raise" and self.delay_s:
            raise TrainerConfigError(
                f"inject_fault: a raised fault fires as {self.method} starts; drop the delay "
                f"(+{self.delay_s:g})"
            )

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """``"role:rank@step=N[:method[+seconds]][:kill|raise]"``, e.g. ``"actor:1@step=30"``
        or ``"critic:0@step=3:update_critic+0.2"``."""
        match = _SPEC.match(text.strip()) if isinstance(text, str) else None
        if match is None or match["method"] in FAULT_ACTIONS:  # "actor:1@step=2:raise"
            raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {text!r}")
        action = cast(FaultAction, match["action"] or "kill")
        return cls(
            match["role"],
            int(match["rank"]),
            int(match["step"]),
            match["method"],
            float(match["delay"] or 0.0),
            action,
        )

    @classmethod
    def parse_all(cls, text: str) -> tuple[FaultSpec, ...]:
        """Several faults, separated by commas (the driver's and the reward's left out: see
        :class:`~sc_trainer.faults.DriverFault` and :class:`~sc_trainer.faults.RewardFault`)."""
        if not isinstance(text, str) or not text.strip():
            raise TrainerConfigError(f"inject_fault must look like {_GRAMMAR}, got {text!r}")
        parts = [
            part
            for part in text.split(",")
            if not is_driver_fault(part) and not part.strip().startswith(REWARD_PREFIX)
        ]
        return tuple(cls.parse(part) for part in parts)

    def __str__(self) -> str:
        where = f"{self.role}:{self.rank}@step={self.step}"
        if self.method is None:
            return where
        delay = f"+{self.delay_s:g}" if self.delay_s else ""
        return f"{where}:{self.method}{delay}:{self.action}"


def inject(group: WorkerGroup[Any], fault: FaultSpec) -> None:
    """Inject ``fault`` into ``group`` (the group of ``fault.role``) as its step begins."""
    if not 0 <= fault.rank < group.world_size:
        raise TrainerConfigError(
            f"inject_fault: rank {fault.rank} is outside the group's {group.world_size} workers"
        )
    if fault.method is not None:
        group.inject_fault(fault.rank, fault.method, action=fault.action, delay_s=fault.delay_s)
        return
    group.kill_worker(fault.rank)


class ServerTargets(Protocol):
    """The engine servers a ``server`` fault can kill (``EngineServers.fleet`` is one)."""

    @property
    def names(self) -> list[str]: ...

    def kill_server(self, name: str) -> None: ...


class FaultTargets(Protocol):
    """The worker groups a fault can be injected into (``TrainerGroups`` has them)."""

    @property
    def actor_rollout(self) -> WorkerGroup[Any]: ...

    @property
    def critic(self) -> WorkerGroup[Any] | None: ...

    @property
    def rollout(self) -> WorkerGroup[Any] | None: ...


def _kill_server(servers: ServerTargets | None, fault: FaultSpec) -> None:
    if servers is None:
        raise TrainerStateError(f"inject_fault {fault}: this run has no engine servers")
    names = servers.names
    if not 0 <= fault.rank < len(names):
        raise TrainerConfigError(
            f"inject_fault {fault}: server {fault.rank} is outside the run's {len(names)} servers"
        )
    servers.kill_server(names[fault.rank])


def inject_due(
    groups: FaultTargets,
    faults: list[FaultSpec],
    step: int,
    servers: ServerTargets | None = None,
) -> list[FaultSpec]:
    """Inject the faults of ``faults`` whose step begins into their roles' groups (a
    ``server`` fault into ``servers``); the faults left for later steps."""
    for fault in (f for f in faults if f.step == step):
        if fault.role == "server":
            logger.warning("step %d: injecting the fault %s", step, fault)
            _kill_server(servers, fault)
            continue
        group = {
            "actor": groups.actor_rollout,
            "critic": groups.critic,
            "rollout": groups.rollout,
        }[fault.role]
        if group is None:
            raise TrainerStateError(f"inject_fault: this run has no {fault.role} group")
        logger.warning("step %d: injecting the fault %s", step, fault)
        inject(group, fault)
    return [f for f in faults if f.step != step]
