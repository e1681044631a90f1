"""Where the batch comes from: the :class:`RolloutSource` protocol the trainer's loop reads.

One training step asks its source for a batch (:meth:`RolloutSource.take`), trains on it,
then tells the source the actor has new weights (:meth:`RolloutSource.after_update`). The
source decides everything about sampling: which processes generate (the actor's worker
group, a rollout group of its own, engine servers behind a router, agent sessions), whether
the next batch is already being generated while this one trains, and how the sampler gets
the actor's weights (nothing to do, a weight sync, a push to the servers). The loop has no
branch on any of it. The sources of this package:

=========================  ==================================================================
:class:`WorkerGroupRollout`  the actor's group samples (colocated), or a rollout group of its
                             own synced after every update (``placement="separate"``)
:class:`AsyncRollout`        a rollout group of its own samples the next batch while the actor
                             trains on this one, under a staleness bound
:class:`ServerRollout`       engine servers behind a router (built-in engine or vLLM), with
                             partial rollout when a staleness bound is set
:class:`~sc_trainer.agents.AgentRollout`  multi-turn agent sessions on those servers
=========================  ==================================================================

A *stage* is the context the trainer times each part of a step in (``timing/<stage>``) and
in which an injected driver fault may kill the driver (``driver@step=N:<stage>``); a source
runs its generation under ``stage("generate")`` and its weight transfer under
``stage("sync_weights")``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from sc_protocol import DataProto

__all__ = ["PromptSource", "RolloutSnapshot", "RolloutSource", "ServersSnapshot", "Stage"]

#: ``stage(name)``: the context one part of a step runs in (timed, and where an injected
#: driver fault may fire)
Stage = Callable[[str], contextlib.AbstractContextManager[None]]


@runtime_checkable
class PromptSource(Protocol):
    """Where a source's prompts come from: each step's batch and the held-out one.

    ``train_batch(step)`` is a function of the step (a resumed or replayed step gets the same
    prompts), each prompt repeated ``responses_per_prompt`` times, rows of one prompt sharing
    a ``uid``; ``val_batch()`` holds each held-out prompt once, with ``do_sample=False``.
    """

    def train_batch(self, step: int) -> DataProto: ...

    def val_batch(self) -> DataProto: ...


@dataclass(frozen=True)
class ServersSnapshot:
    """What a detached run's engine servers hand to a driver that re-attaches
    (:meth:`~sc_trainer.rollout.EngineServers.snapshot`): the servers' names (the fleet:
    named Ray actors of the run), the push bookkeeping (the last push version, the weight
    folder it loaded, the folders of the newest pushes, kept on disk, and the push versions
    that hold another actor version than their own number, which the staleness bound and
    the batches' version columns translate through). The router's session affinity is not
    kept: a new router starts without it (sessions stick again from their next request;
    affinity only spares a server's prefix cache, it never changes what is sampled)."""

    names: tuple[str, ...] = ()
    last_push: int | None = None
    weights_path: str | None = None
    recent_paths: tuple[str, ...] = ()
    actor_version_of: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> ServersSnapshot:
        """The snapshot written as JSON (``dataclasses.asdict``) read back."""
        last, path = raw.get("last_push"), raw.get("weights_path")
        return cls(
            names=tuple(str(n) for n in raw.get("names", ())),
            last_push=None if last is None else int(last),
            weights_path=None if path is None else str(path),
            recent_paths=tuple(str(p) for p in raw.get("recent_paths", ())),
            actor_version_of={
                int(k): int(v) for k, v in dict(raw.get("actor_version_of", {})).items()
            },
        )


@dataclass(frozen=True)
class RolloutSnapshot:
    """What a source must hand to a driver that re-attaches to a detached run (see
    :class:`~sc_trainer.runs.RunState`): the weight-sync version, and for a source that
    prefetches, the actor version each sync version sent, the sampler's current one, and
    the step whose generation it launched and has not handed out yet; for a source on
    engine servers, theirs (:class:`ServersSnapshot`)."""

    weight_sync_version: int | None = None
    actor_version_of: dict[int, int] = field(default_factory=dict)
    rollout_actor_version: int | None = None
    launched_step: int | None = None
    servers: ServersSnapshot | None = None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> RolloutSnapshot:
        """The snapshot written as JSON (``dataclasses.asdict``) read back."""
        fields = dict(raw)
        fields["actor_version_of"] = {
            int(k): int(v) for k, v in dict(fields.get("actor_version_of", {})).items()
        }
        servers = fields.get("servers")
        fields["servers"] = None if servers is None else ServersSnapshot.from_dict(servers)
        return cls(**fields)


@runtime_checkable
class RolloutSource(Protocol):
    """Where the trainer's batches come from (see the module's documentation).

    Versions count actor updates: the actor is at version ``v`` after ``v`` updates, and the
    batch of step ``s`` trains it from version ``s - 1`` to ``s``.
    """

    @property
    def on_policy(self) -> bool:
        """Whether every batch is sampled with the actor's current weights: the trainer then
        recomputes the PPO ratio's old log-probs on the actor; otherwise the ratio is against
        the sampling policy's own (``rollout_log_probs``)."""
        ...

    def start(self, version: int) -> None:
        """Before the first step of a run (and once a recovery restored the actor to
        ``version``): the sampler gets the actor's current weights, those of ``version``."""
        ...

    def drop(self) -> None:
        """Forget every batch generated, or generating, ahead of the loop: a recovery
        follows, and the steps they were for are generated again."""
        ...

    def take(self, step: int, stage: Stage) -> tuple[DataProto, dict[str, Any]]:
        """Step ``step``'s batch, prompts and responses (the rollout worker's columns), and
        the source's metrics of it (``rollout/*``, ``agent/*``)."""
        ...

    def after_update(self, step: int, stage: Stage, validates: bool) -> dict[str, Any]:
        """The actor was updated to version ``step``; bring the sampler the weights it needs
        next (``validates``: a validation follows, which measures these weights). Returns
        the metrics of the transfer (``sync/*``)."""
        ...

    def validation_batch(self, step: int) -> DataProto:
        """Greedy responses to the held-out prompts (one row each), with the columns the
        task scores, sampled with the actor's weights of version ``step``."""
        ...

    def snapshot(self) -> RolloutSnapshot:
        """What a re-attaching driver needs to continue with this source."""
        ...

    def restore(self, snapshot: RolloutSnapshot) -> None:
        """Continue from a previous driver's :meth:`snapshot` (a detached run's re-attach)."""
        ...

    def close(self, *, detach: bool = False) -> None:
        """Stop: the driver-side threads, and (unless ``detach``: a detached run's driver
        that stops leaves its workers to the next one) the servers and channels it owns."""
        ...
