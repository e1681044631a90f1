"""Losing a whole node on purpose, for fault-injection tests: :class:`NodeLoss`.

A machine that goes away takes its Ray node with it: the raylet, its agents, and every
worker process on it (every rank, spare and engine server there). ``NodeLoss(node_id)``
arms that loss: it starts a tiny actor on the node (it reserves nothing) and waits until it
runs there, so that :meth:`NodeLoss.fire` acts at once, inside whatever the run is doing;
``fire`` has it stop and SIGKILL the node's raylet and every process below it, itself last,
with no clean-up. The cluster declares the node dead only once its health checks of the
node fail (about 15 s with Ray's defaults): until then a call to an actor there fails as
unreachable, and the actor is not reported dead. The driver's own node is refused. Linux
only (the killer reads ``/proc``); a node whose worker processes were not started by its
raylet is refused when the loss is armed.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import _ray_api as rapi
from ._errors import NodeLossError

if TYPE_CHECKING:
    from ._worker_group import RayWorkerGroup

__all__ = ["NodeLoss"]

logger = logging.getLogger("sc_ray")

#: How long arming (the killer's start on the node) and firing (its process gone) may take.
DEFAULT_NODE_LOSS_TIMEOUT_S = 60.0


class NodeLoss:
    """The node ``node_id``, armed to be lost (see the module); :meth:`fire` loses it,
    :meth:`cancel` stands down. Waits up to ``timeout_s`` seconds for the killer to start
    there, else :class:`NodeLossError` (as for the driver's own node, or one not alive)."""

    def __init__(self, node_id: str, *, timeout_s: float = DEFAULT_NODE_LOSS_TIMEOUT_S) -> None:
        self.node_id = node_id
        self.timeout_s = timeout_s
        where = f"NodeLoss({node_id[:12]})"
        if node_id == rapi.current_node_id():
            raise NodeLossError(f"{where}: it is the driver's own node; lose another one")
        alive = {n.node_id for n in rapi.list_nodes() if n.alive}
        if node_id not in alive:
            raise NodeLossError(
                f"{where}: no live node has that id (alive: {sorted(n[:12] for n in alive)})"
            )
        self._killer, ready = rapi.start_node_killer(node_id)
        try:
            (pid,) = rapi.get([ready], timeout_s)
        except Exception as exc:
            rapi.kill(self._killer)
            failure = rapi.classify_failure(exc)
            why = f"{failure.cause_type}: {failure.cause}"
            raise NodeLossError(
                f"{where}: the process that loses the node did not start there within "
                f"{timeout_s:g} s ({why})"
            ) from exc
        #: the pid of the node's raylet, on its machine
        self.raylet_pid = int(pid)
        self._done = False

    @classmethod
    def of_rank(
        cls,
        group: RayWorkerGroup,
        rank: int | None = None,
        *,
        timeout_s: float = DEFAULT_NODE_LOSS_TIMEOUT_S,
    ) -> NodeLoss:
        """The node ``group``'s rank ``rank`` runs on; ``None``: the node of the highest
        rank that does not run on the driver's node (:class:`NodeLossError` if none)."""
        nodes = group.worker_node_ids()
        if rank is not None:
            if not 0 <= rank < len(nodes):
                raise NodeLossError(
                    f"NodeLoss.of_rank: rank {rank} is outside group {group.name_prefix!r}'s "
                    f"{len(nodes)} ranks"
                )
            node = nodes[rank]
            if node is None:
                raise NodeLossError(
                    f"NodeLoss.of_rank: rank {rank} of group {group.name_prefix!r} is not "
                    "placed on a node (dead or not started)"
                )
            return cls(node, timeout_s=timeout_s)
        driver = rapi.current_node_id()
        for node in reversed(nodes):
            if node is not None and node != driver:
                return cls(node, timeout_s=timeout_s)
        raise NodeLossError(
            f"NodeLoss.of_rank: every rank of group {group.name_prefix!r} runs on the driver's "
            "node; there is no other node of the group to lose"
        )

    def fire(self) -> None:
        """Lose the node now: its raylet and every process below it are stopped, then
        SIGKILLed. Returns once the killer's own process is gone (the node's with it), at
        most ``timeout_s`` seconds, else :class:`NodeLossError`; once only."""
        where = f"NodeLoss({self.node_id[:12]}).fire"
        if self._done:
            raise NodeLossError(f"{where}: this loss was already fired or cancelled")
        self._done = True
        logger.warning(
            "%s: losing node %s (its raylet, pid %d, and every process below it)",
            where,
            self.node_id,
            self.raylet_pid,
        )
        ref = rapi.fire_node_killer(self._killer)
        try:
            rapi.get([ref], self.timeout_s)
        except Exception as exc:
            failure = rapi.classify_failure(exc)
            if failure.kind == "died":
                return  # its process is gone, as asked
            raise NodeLossError(
                f"{where}: the node was not lost within {self.timeout_s:g} s "
                f"({failure.cause_type}: {failure.cause})"
            ) from exc
        raise NodeLossError(f"{where}: the killer returned without losing the node")

    def cancel(self) -> None:
        """Stand down: stop the killer, leave the node as it is (nothing after :meth:`fire`)."""
        if not self._done:
            self._done = True
            rapi.kill(self._killer)

    def __repr__(self) -> str:
        state = "done" if self._done else "armed"
        return f"NodeLoss({self.node_id[:12]!r}, {state})"
