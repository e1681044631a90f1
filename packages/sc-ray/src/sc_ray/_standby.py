"""Hot standby: spare actors that take a dead rank's place without a process start-up.

``RayWorkerGroup(..., standby=N)`` starts N spare actors beside the group's workers, spread
over the nodes of its pool. A spare is a process of the group's actor class whose modules
are imported (torch, the model code: what makes a start-up slow) and whose worker is not
built yet: its constructor returns at once, and it reserves no resources (``num_cpus=0``,
no GPU) on its node's placement group.

When ``replace_ranks`` replaces a rank and a spare waits on that rank's node, the spare
becomes the rank (``_sc_take_over``): it receives the rank's environment, with the
``CUDA_VISIBLE_DEVICES`` the dead rank had (recorded when the spares were started), and runs
the worker's constructor; a rank with no spare on its node gets a new actor as before. Each
spare used is followed by a new one, started in the background, so that the next death
finds one too.

The process that took over runs on the dead rank's node and devices, but without the dead
actor's Ray resource reservation: that share of the placement group stays reserved and
unused, and Ray's accounting shows the spare's zero.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from . import _ray_api as rapi
from ._actor_launch import LaunchSpec, create_standby
from ._resource_pool import BundleSlot

__all__ = ["Spare", "Standby"]

logger = logging.getLogger("sc_ray.standby")

#: How long to wait for a worker to say which devices it has.
_PROBE_TIMEOUT_S = 60.0


@dataclass
class Spare:
    """One spare actor, on the node (placement group) of ``slot``."""

    actor: rapi.ActorHandle
    name: str
    slot: BundleSlot
    ready: rapi.ObjectRef


class Standby:
    """The spares of one group: started up front, taken by node, replaced when taken."""

    def __init__(self, spec: LaunchSpec, count: int, workers: list[rapi.ActorHandle]) -> None:
        self._spec = spec
        self._count = 0
        slots = spec.pool.bundle_slots()
        #: one slot per node: the first rank's, where that node's spares run
        self._node_slots: dict[int, BundleSlot] = {}
        for slot in slots:
            self._node_slots.setdefault(slot.node_index, slot)
        self.spares: list[Spare] = []
        #: the CUDA_VISIBLE_DEVICES of every rank (None: not set), for a spare taking over
        self.devices: list[str | None] = [None] * len(slots)
        if spec.pool.use_gpu:
            for rank, worker in enumerate(workers):
                self.devices[rank] = rapi.actor_node_and_devices(worker, _PROBE_TIMEOUT_S)[1]
        nodes = sorted(self._node_slots)
        try:
            for i in range(count):
                self._start(self._node_slots[nodes[i % len(nodes)]])
        except BaseException:
            self.close()
            raise

    def _start(self, slot: BundleSlot) -> None:
        self._count += 1
        name = f"{self._spec.name_prefix}{self._spec.cia.worker_cls.__name__}_standby{self._count}"
        actor = create_standby(self._spec, slot, name)
        self.spares.append(Spare(actor, name, slot, rapi.ready_ref(actor)))

    def refs(self) -> list[rapi.ObjectRef]:
        """The references that are ready once each spare has started."""
        return [spare.ready for spare in self.spares]

    def take(self, node_index: int) -> Spare | None:
        """A spare on node ``node_index`` (started ones first), replaced by a new one that
        starts in the background; ``None`` when that node has none alive. Spares that died
        (lost with their node) are dropped and replaced by new ones, which start where Ray
        placed that node's placement group again."""
        here = [s for s in self.spares if s.slot.node_index == node_index]
        dead = [s for s in here if rapi.actor_state(s.actor) == "DEAD"]
        for spare in dead:
            self.spares.remove(spare)
            logger.warning(
                "standby %s on node %d is dead; starting another", spare.name, node_index
            )
            self._start(self._node_slots[node_index])
        here = [s for s in here if s not in dead]  # the new ones are not among them
        if not here:
            return None
        spare = next((s for s in here if rapi.is_ready(s.ready)), here[0])
        self.spares.remove(spare)
        self._start(self._node_slots[node_index])
        logger.info("standby %s takes over a rank on node %d", spare.name, node_index)
        return spare

    def close(self) -> None:
        for spare in self.spares:
            rapi.kill(spare.actor)
        self.spares.clear()


def take_over_args(
    env: dict[str, str], devices: str | None, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[dict[str, str], tuple[Any, ...], dict[str, Any]]:
    """What ``_sc_take_over`` receives for a rank: its environment (with the dead rank's
    devices, when it had some), and the worker's constructor arguments."""
    if devices is not None:
        env = {**env, "CUDA_VISIBLE_DEVICES": devices}
    return env, tuple(args), dict(kwargs)
