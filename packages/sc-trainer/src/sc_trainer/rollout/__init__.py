"""Where the batch comes from: the rollout sources the trainer's loop reads, and what they
run on.

:class:`RolloutSource` is the protocol (``take`` a step's batch, ``after_update`` bring the
sampler the new weights, ``close``); its implementations are :class:`WorkerGroupRollout`
(the actor's group, or a rollout group of its own synced after each update),
:class:`AsyncRollout` (that rollout group generating one step ahead under a staleness
bound), :class:`ServerRollout` (engine servers behind a router, with partial rollout) and
:class:`~sc_trainer.agents.AgentRollout` (agent sessions on those servers). Underneath:
:class:`EngineServers` and :class:`RolloutServerFleet` (the servers on Ray and their
router), :class:`RouterRollout` (``generate_sequences`` over a router),
:class:`PartialRollout` (generation across weight pushes) and :class:`WeightPublisher`
(weights written for, and pushed to, the servers).
"""

from sc_dispatch import _public

from .._errors import (
    RolloutFleetError,
    RolloutInputError,
    StalenessBoundError,
    WeightPublishError,
)
from ._async import AsyncRollout, GenerationWindow
from ._engine_servers import EngineServers, ServerEngine
from ._fleet import ArgvFactory, RolloutServerFleet
from ._partial import ON_STALE, OnStale, PartialRollout
from ._publisher import WEIGHTS_FILE, WeightPublisher
from ._router import PendingBatch, RouterRollout, RouterSampling
from ._servers import ServerRollout
from ._source import PromptSource, RolloutSnapshot, RolloutSource, ServersSnapshot, Stage
from ._workers import WorkerGroupRollout

__all__ = [
    "ArgvFactory",
    "AsyncRollout",
    "EngineServers",
    "GenerationWindow",
    "ON_STALE",
    "OnStale",
    "PartialRollout",
    "PendingBatch",
    "PromptSource",
    "RolloutFleetError",
    "RolloutInputError",
    "RolloutServerFleet",
    "RolloutSnapshot",
    "RolloutSource",
    "RouterRollout",
    "RouterSampling",
    "ServerEngine",
    "ServerRollout",
    "ServersSnapshot",
    "Stage",
    "StalenessBoundError",
    "WEIGHTS_FILE",
    "WeightPublishError",
    "WeightPublisher",
    "WorkerGroupRollout",
]

_public.publish(globals())
