"""The trainer's engine servers (``--rollout builtin`` or ``--rollout vllm``) and the rollout
source that generates on them.

Instead of a rollout worker group, the run starts ``rollout_servers`` engine servers, each
owned by a Ray actor on a CPU pool of its own (:class:`RolloutServerFleet`), behind a router
(:class:`EngineServers`). The engine is sc-workers' built-in one (``python -m
sc_workers.rollout``) or vLLM (``python -m sc_rollout vllm``, run by the vLLM environment's
interpreter; made by ``python -m sc_rollout vllm-env create``, and a clear error naming that
command when it is missing).

Weights: after each actor update the actor group writes its weights as a Hugging Face
folder under ``<output>/weights/v<version>`` (``export_hf_model``: rank 0 writes next to the
folder and renames it into place) and the router pushes that folder to every server, at the
actor's version (its number of updates), or, after a recovery went back to an older
checkpoint, under the next weight version (the servers' versions only grow; see
``_engine_servers.py``): batches report actor versions either way. A server restarted by the
router is re-synced to the last version before it takes requests. The two newest folders are
kept.

:class:`ServerRollout` is the rollout source over those servers: each step's prompts go
through a :class:`RouterRollout` (the rollout worker's batch format), or, with a staleness
bound k > 0, through a :class:`PartialRollout`: the next step's batch starts generating as
this one is taken and runs across the weight push (see ``_partial.py``).
"""

from __future__ import annotations

import logging
from typing import Any

from sc_protocol import DataProto

from ._engine_servers import EngineServers
from ._partial import PartialRollout
from ._router import PendingBatch, RouterRollout, RouterSampling
from ._source import PromptSource, RolloutSnapshot, Stage

__all__ = ["ServerRollout"]

logger = logging.getLogger(__name__)


class ServerRollout:
    """The rollout source on engine servers (see the module's documentation): each step's
    ``prompts`` generated through the router with the rollout worker's ``sampling``; with
    ``staleness`` k > 0, partial rollout up to step ``last_step``. Owns ``servers``."""

    def __init__(
        self,
        servers: EngineServers,
        prompts: PromptSource,
        sampling: RouterSampling,
        *,
        staleness: int = 0,
        last_step: int = 0,
    ) -> None:
        self.servers = servers
        self.prompts = prompts
        self.last_step = last_step
        self.rollout = RouterRollout(servers.router, sampling, session_key="uid")
        #: partial rollout (``staleness`` > 0), and the step whose batch generates meanwhile
        self.partial = (
            PartialRollout(self.rollout, staleness, version_of=servers.actor_version)
            if staleness > 0
            else None
        )
        self._prefetch: tuple[int, PendingBatch] | None = None

    @property
    def on_policy(self) -> bool:
        """Partial rollout trains on trajectories that span weight versions: off-policy."""
        return self.partial is None

    def start(self, version: int) -> None:
        """The servers take the actor's weights of ``version``."""
        self.servers.push(version)

    def take(self, step: int, stage: Stage) -> tuple[DataProto, dict[str, Any]]:
        if self.partial is None:
            batch = self.prompts.train_batch(step)
            with stage("generate"):  # prompts in, prompts + responses out
                out = self.rollout.generate_sequences(batch, batch_id=f"s{step}")
            return self.servers.in_actor_versions(out), {}
        with stage("generate"):  # prefetched; the next one generates across this update
            batch, staleness = self._take_partial(self.partial, step)
        return batch, {
            "rollout/staleness": staleness,
            "rollout/weight_version_max": int(max(batch.non_tensor_batch["weight_version_max"])),
            "rollout/regenerated_rows": batch.meta_info["regenerated_rows"],
        }

    def _take_partial(self, partial: PartialRollout, step: int) -> tuple[DataProto, int]:
        """Step ``step``'s batch within the staleness bound, and the next step's generation
        started unless ``step`` is the last (it runs across this step's weight push). The
        batch trains the actor from version ``step - 1``; returns it and its staleness, that
        minus its oldest version."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None and prefetch[0] != step:  # a recovery or resume moved the step
            prefetch[1].abort()
            prefetch = None
        if prefetch is None:
            prefetch = (step, partial.submit(self.prompts.train_batch(step), batch_id=f"s{step}"))
        batch = self.servers.in_actor_versions(partial.take(prefetch[1], actor_version=step - 1))
        if step < self.last_step:
            nxt = step + 1
            pending = partial.submit(self.prompts.train_batch(nxt), batch_id=f"s{nxt}")
            self._prefetch = (nxt, pending)
        return batch, (step - 1) - int(batch.meta_info["weight_version"])

    def after_update(self, step: int, stage: Stage, validates: bool) -> dict[str, Any]:
        with stage("sync_weights"):  # the servers sample the next step with these weights
            self.servers.push(step)
        return {"sync/weight_version": step}

    def validation_batch(self, step: int) -> DataProto:
        out = self.rollout.generate_sequences(self.prompts.val_batch(), batch_id=f"val{step}")
        return self.servers.in_actor_versions(out)

    def snapshot(self) -> RolloutSnapshot:
        """The servers' names and push bookkeeping (a detached run's re-attach)."""
        return RolloutSnapshot(servers=self.servers.snapshot())

    def restore(self, snapshot: RolloutSnapshot) -> None:
        """Continue a detached run's servers where the previous driver left them
        (:meth:`EngineServers.resume`); the next step's generation, if that driver had
        started one, is generated again when its step is taken."""
        if snapshot.servers is not None:
            self.servers.resume(snapshot.servers)

    def drop(self) -> None:
        """Abort the next step's generation, if one is in flight."""
        prefetch, self._prefetch = self._prefetch, None
        if prefetch is not None:
            prefetch[1].abort()

    def close(self, *, detach: bool = False) -> None:
        """Abort the generation in flight, then stop the router's pool and the servers
        (``detach``: a detached run's driver that stops leaves the servers to the next
        driver, which adopts them)."""
        self.drop()
        try:
            self.rollout.close()
        finally:
            self.servers.close(detach=detach)
