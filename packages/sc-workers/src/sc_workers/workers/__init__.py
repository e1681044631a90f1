"""Workers: the actor/rollout/reference worker and the critic worker."""

from ._actor import ROLES, ActorRolloutRefWorker
from ._checkpoint import export_hf_checkpoint
from ._critic import CriticWorker
from ._sampling import SamplingParams, filter_logits

__all__ = [
    "ROLES",
    "ActorRolloutRefWorker",
    "CriticWorker",
    "SamplingParams",
    "export_hf_checkpoint",
    "filter_logits",
]
