"""Weight sync between a training mesh and a separately placed rollout mesh.

* :mod:`._layout` — :class:`Region` and :class:`ModelLayout`: which box of every parameter each
  rank holds, reported by the live modules (:func:`module_regions`);
* :mod:`._plan` — :class:`TransferPlan`: each needed element sent once, the senders sharing
  the work (:func:`plan_for` caches one plan per pair of layouts);
* :mod:`._channel` — moving the pieces: a torch.distributed group spanning both worker groups
  (:class:`ProcessGroupChannel`, gloo or nccl) or in-memory copies within one process
  (:class:`InMemoryChannel`, for the local backend and a debugger);
* :mod:`._staging` — packing, and the receiver's staged copy of the incoming version (the
  two-phase apply: receive everything, then commit);
* :mod:`._transfer` — one rank's part: :func:`send_weights`, :func:`receive_weights`;
* :mod:`._controller` — :class:`WeightSync`, the controller's side (plan, channel, versions).
"""

from sc_dispatch import _public

from ._channel import Channel, ChannelSpec, InMemoryChannel, ProcessGroupChannel, open_channel
from ._controller import WeightSync
from ._layout import ModelLayout, Region, module_regions
from ._plan import Piece, TransferPlan, build_plan, plan_for
from ._staging import StagedWeights, held_tensors, pack_pieces
from ._transfer import receive_weights, send_weights

__all__ = [
    "Channel",
    "ChannelSpec",
    "InMemoryChannel",
    "ModelLayout",
    "Piece",
    "ProcessGroupChannel",
    "Region",
    "StagedWeights",
    "TransferPlan",
    "WeightSync",
    "build_plan",
    "held_tensors",
    "module_regions",
    "open_channel",
    "pack_pieces",
    "plan_for",
    "receive_weights",
    "send_weights",
]

_public.publish(globals())
