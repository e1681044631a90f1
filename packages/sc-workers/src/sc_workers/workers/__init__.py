"""Workers: the actor/rollout/reference worker, the critic worker and the rollout worker, and
the rollout batch format they and the trainer's rollouts return (:func:`rollout_tensors`)."""

from sc_dispatch import _public

from ._actor import ROLES, ActorRolloutRefWorker
from ._checkpoint import export_hf_checkpoint, published_step
from ._critic import CriticWorker
from ._rollout import RolloutWorker
from ._rollout_format import ROLLOUT_KEYS, rollout_tensors
from ._sampling import BatchSampling, filter_logits

__all__ = [
    "ActorRolloutRefWorker",
    "BatchSampling",
    "CriticWorker",
    "ROLES",
    "ROLLOUT_KEYS",
    "RolloutWorker",
    "export_hf_checkpoint",
    "filter_logits",
    "published_step",
    "rollout_tensors",
]

_public.publish(globals())
