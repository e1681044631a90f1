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

A run's group (``_run.py``) records its spares (:meth:`Standby.facts`: their names and nodes,
how many were started, the ranks' devices); a driver that re-attaches *adopts* the live ones
(``adopted``) instead of starting new processes, and starts only what is missing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from . import _ray_api as rapi
from ._actor_launch import LaunchSpec, create_standby
from ._resource_pool import BundleSlot

__all__ = ["AdoptedSpare", "Spare", "Standby"]

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


@dataclass(frozen=True)
class AdoptedSpare:
    """A live spare a previous driver started (a run's re-attach): its actor, its name and
    the node (the pool's node index) it waits on."""

    actor: rapi.ActorHandle
    name: str
    node_index: int


class Standby:
    """The spares of one group: started up front, taken by node, replaced when taken.

    ``adopted``: live spares of a previous driver of the run (``_run_attach.py``), kept in
    place of new ones (up to ``count``; the others are killed); ``started``: how many spares
    the group started before (new names continue from there: a spare that took over a rank
    keeps its name as the rank's worker); ``devices``: the ranks' recorded devices (else
    probed from ``workers``)."""

    def __init__(
        self,
        spec: LaunchSpec,
        count: int,
        workers: list[rapi.ActorHandle],
        *,
        adopted: Sequence[AdoptedSpare] = (),
        started: int = 0,
        devices: Sequence[str | None] | None = None,
    ) -> None:
        self._spec = spec
        self._count = started
        slots = spec.pool.bundle_slots()
        #: one slot per node: the first rank's, where that node's spares run
        self._node_slots: dict[int, BundleSlot] = {}
        for slot in slots:
            self._node_slots.setdefault(slot.node_index, slot)
        self.spares: list[Spare] = []
        #: the CUDA_VISIBLE_DEVICES of every rank (None: not set), for a spare taking over
        self.devices: list[str | None] = [None] * len(slots)
        if devices is not None and len(devices) == len(slots):
            self.devices = list(devices)
        elif spec.pool.use_gpu:
            for rank, worker in enumerate(workers):
                try:
                    self.devices[rank] = rapi.actor_node_and_devices(worker, _PROBE_TIMEOUT_S)[1]
                except Exception as exc:  # a dead rank (a re-attach): no devices to record
                    logger.warning("standby: rank %d's devices unknown: %s", rank, exc)
        try:
            for spare in adopted:
                here = self._node_slots.get(spare.node_index)
                if len(self.spares) < count and here is not None:
                    ready = rapi.ready_ref(spare.actor)
                    self.spares.append(Spare(spare.actor, spare.name, here, ready))
                else:  # more spares than this driver asks, or a node the pool lost
                    rapi.kill(spare.actor)
            if self.spares:
                logger.info("standby: adopted the spares %s", [s.name for s in self.spares])
            for _ in range(len(self.spares), count):
                self._start(self._node_slots[self._emptiest_node()])
        except BaseException:
            self.close()
            raise

    def _emptiest_node(self) -> int:
        """The node with the fewest spares (the lowest index on a tie)."""
        load = {node: 0 for node in self._node_slots}
        for spare in self.spares:
            load[spare.slot.node_index] = load.get(spare.slot.node_index, 0) + 1
        return min(sorted(load), key=lambda node: load[node])

    def facts(self) -> dict[str, Any]:
        """What a run records of its group's standby for a driver that re-attaches: the
        spares' names, the node each waits on, how many were started, the ranks' devices."""
        return {
            "spares": [spare.name for spare in self.spares],
            "spare_nodes": {spare.name: spare.slot.node_index for spare in self.spares},
            "standby_started": self._count,
            "standby_devices": list(self.devices),
        }

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
