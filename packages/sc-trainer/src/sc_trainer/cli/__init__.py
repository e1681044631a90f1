"""The commands: ``sc-demo`` (:func:`demo_main`), a small RL training run on a local Ray
cluster it starts itself, or detached on a standing one; ``sc-train`` (:func:`train_main`),
PPO or GRPO on your own model, data and reward from a config file with verl's keys;
``sc-export`` (:func:`export_main`), a checkpoint as a Hugging Face folder; ``sc-eval``
(:func:`eval_main`), a checkpoint scored on a validation file (avg@k, pass@k)."""

from sc_dispatch import _public

from ._demo import build_parser, config_from_args, demo_main
from ._eval import eval_main
from ._train import export_main, train_main, train_parser

__all__ = [
    "build_parser",
    "config_from_args",
    "demo_main",
    "eval_main",
    "export_main",
    "train_main",
    "train_parser",
]

_public.publish(globals())
