"""Workers: the actor/rollout/reference worker, the critic worker and the rollout worker."""

from sc_dispatch import _public

from ._actor import ROLES, ActorRolloutRefWorker
from ._checkpoint import export_hf_checkpoint, published_step
from ._critic import CriticWorker
from ._rollout import RolloutWorker
from ._sampling import BatchSampling, filter_logits

__all__ = [
    "ActorRolloutRefWorker",
    "BatchSampling",
    "CriticWorker",
    "ROLES",
    "RolloutWorker",
    "export_hf_checkpoint",
    "filter_logits",
    "published_step",
]

_public.publish(globals())
