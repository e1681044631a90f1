"""The built-in rollout engine: a local Hugging Face causal LM behind sc-rollout's engine
contract (:class:`sc_rollout.RolloutEngine`).

* :class:`TorchRolloutEngine` — continuous batching on one scheduler thread, per-request
  seeded sampling with the model's log-probs, weights loaded at a version between two
  decoding steps (checked name by name first), pause, abort, sleep and wake up;
* :class:`TorchRolloutEngineConfig` — its settings (model directory, device, dtype, batch size);
* :func:`torch_engine_argv` — the command line of a server process for it
  (``python -m sc_workers.rollout --model DIR``), for :class:`sc_rollout.ServerProcess`.

Needs the ``hf`` extra (``sc-workers[hf]``) to build an engine; importing this module does
not import transformers.
"""

from sc_dispatch import _public

from ._cli import torch_engine_argv
from ._config import TorchRolloutEngineConfig
from ._engine import TorchRolloutEngine

__all__ = [
    "TorchRolloutEngine",
    "TorchRolloutEngineConfig",
    "torch_engine_argv",
]

_public.publish(globals())
