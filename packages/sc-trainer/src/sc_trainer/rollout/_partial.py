"""Partial rollout: generation that runs across weight updates, under a staleness bound.

With asynchronous training a weight update must not wait for the generation in flight.
:meth:`PartialRollout.submit` sends a prompt batch's requests and returns at once; the
trainer updates the actor meanwhile and publishes its weights
(:meth:`~sc_trainer.rollout.WeightPublisher.publish`), which every server loads while its
requests run: each request continues on the new weights from its next token. A trajectory
thus records the span of versions it was sampled with, ``weight_version_min`` (its first
token) to ``weight_version_max`` (its last). Every row's request ends once, and its result
is taken once.

Versions count actor updates (the publisher publishes actor version ``v``'s weights as
``v``). The bound, with ``staleness`` k: when the trainer takes a batch to update the actor
from version ``v`` (:meth:`PartialRollout.take`), every trajectory must have
``v - weight_version_min <= k``.

An over-stale trajectory is never dropped silently. With ``on_stale="regenerate"`` (the
default) its result is discarded (logged, and counted in ``meta_info["regenerated_rows"]``)
and its row generated again, at the weights the servers hold now; this needs those weights
to be within the bound themselves (publish first), else, or after ``max_regenerations``
rounds, :class:`~sc_trainer.rollout.StalenessBoundError` is raised. With ``on_stale="raise"``
the first over-stale batch raises :class:`~sc_trainer.rollout.StalenessBoundError`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from sc_protocol import DataProto
from sc_rollout import GenerateResult

from .._errors import RolloutInputError, StalenessBoundError, int_at_least
from ._router import PendingBatch, RouterRollout, build_batch

__all__ = ["ON_STALE", "OnStale", "PartialRollout"]

logger = logging.getLogger(__name__)

#: what :meth:`PartialRollout.take` does with a trajectory older than the bound
OnStale = Literal["regenerate", "raise"]
ON_STALE: tuple[OnStale, ...] = ("regenerate", "raise")


def _first_version(result: GenerateResult) -> int:
    low = result.min_weight_version
    return result.weight_version if low is None else low


class PartialRollout:
    """Generation in the background over a :class:`RouterRollout`, taken under a staleness
    bound of ``staleness`` versions (see the module's documentation).

    ``on_stale``: ``"regenerate"`` or ``"raise"``; ``max_regenerations``: rounds of
    regeneration one :meth:`take` may run before it raises; ``version_of``: the actor version
    a weight version of the servers holds (``EngineServers.actor_version``; None: the same
    number), so the bound counts actor versions.
    """

    def __init__(
        self,
        rollout: RouterRollout,
        staleness: int,
        *,
        on_stale: OnStale = "regenerate",
        max_regenerations: int = 2,
        version_of: Callable[[int], int] | None = None,
    ) -> None:
        if not isinstance(rollout, RouterRollout):
            raise RolloutInputError(
                f"PartialRollout: rollout must be a RouterRollout, got {type(rollout).__name__}"
            )
        int_at_least(staleness, 0, "PartialRollout: staleness", RolloutInputError)
        if on_stale not in ON_STALE:
            raise RolloutInputError(
                f"PartialRollout: on_stale must be one of {ON_STALE}, got {on_stale!r}"
            )
        int_at_least(max_regenerations, 0, "PartialRollout: max_regenerations", RolloutInputError)
        self.rollout = rollout
        self.staleness = staleness
        self.on_stale = on_stale
        self.max_regenerations = max_regenerations
        #: the actor version a weight version of the servers holds (None: the same number)
        self.version_of = version_of

    def submit(self, prompts: DataProto, *, batch_id: str | None = None) -> PendingBatch:
        """Start generating ``prompts`` in the background; returns at once."""
        return self.rollout.submit(prompts, batch_id=batch_id)

    def _actor_version(self, weight_version: int) -> int:
        return weight_version if self.version_of is None else self.version_of(weight_version)

    def stale_rows(self, results: list[GenerateResult], actor_version: int) -> list[int]:
        """The rows whose first token is more than ``staleness`` versions older than
        ``actor_version``."""
        return [
            row
            for row, result in enumerate(results)
            if actor_version - self._actor_version(_first_version(result)) > self.staleness
        ]

    def take(self, pending: PendingBatch, actor_version: int) -> DataProto:
        """Wait for every row of ``pending`` and return its output batch for updating the
        actor from ``actor_version``, every trajectory within the bound (see the module's
        documentation). ``meta_info["regenerated_rows"]``: rows generated again."""
        if isinstance(actor_version, bool) or not isinstance(actor_version, int):
            raise RolloutInputError(
                f"PartialRollout.take: actor_version must be an int, got {actor_version!r}"
            )
        regenerated = 0
        rounds = 0
        results = pending.results()
        while stale := self.stale_rows(results, actor_version):
            oldest = min(self._actor_version(_first_version(results[row])) for row in stale)
            where = (
                f"PartialRollout.take: batch {pending.batch_id}: {len(stale)} of "
                f"{len(results)} trajectories started at weight version {oldest}, more than "
                f"staleness={self.staleness} versions before actor version {actor_version}"
            )
            if self.on_stale == "raise":
                raise StalenessBoundError(where)
            served = self.rollout.router.weight_version
            current = None if served is None else self._actor_version(served)
            if current is None or actor_version - current > self.staleness:
                raise StalenessBoundError(
                    f"{where}; they cannot be generated again within the bound: the servers "
                    f"hold weight version {current} (publish newer weights first)"
                )
            if rounds == self.max_regenerations:
                raise StalenessBoundError(
                    f"{where}, after {rounds} round(s) of generating them again"
                )
            rounds += 1
            regenerated += len(stale)
            logger.warning("%s: generating rows %s again at version %s", where, stale, current)
            pending.regenerate(stale)
            results = pending.results()
        out = build_batch(pending.prompts, pending.tensors, results, pending.sampling)
        out.meta_info["regenerated_rows"] = regenerated
        return out
