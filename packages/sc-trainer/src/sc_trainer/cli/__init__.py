"""The commands: ``sc-demo`` (:func:`demo_main`), a small RL training run on a local Ray
cluster it starts itself, or detached on a standing one."""

from sc_dispatch import _public

from ._demo import build_parser, config_from_args, demo_main

__all__ = ["build_parser", "config_from_args", "demo_main"]

_public.publish(globals())
