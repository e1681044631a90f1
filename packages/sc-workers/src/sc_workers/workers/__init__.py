"""Workers: the actor/rollout/reference worker, the critic worker and the rollout worker."""

from ._actor import ROLES, ActorRolloutRefWorker
from ._checkpoint import export_hf_checkpoint, published_step
from ._critic import CriticWorker
from ._rollout import RolloutWorker
from ._sampling import SamplingParams, filter_logits

__all__ = [
    "ROLES",
    "ActorRolloutRefWorker",
    "CriticWorker",
    "RolloutWorker",
    "SamplingParams",
    "export_hf_checkpoint",
    "published_step",
    "filter_logits",
]
