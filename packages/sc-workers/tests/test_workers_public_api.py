"""sc-workers' public modules keep the contract of ``sc_dispatch._public``: ``__all__``
sorted, and each exported class and function names a public module that exports it as its
``__module__`` (a subpackage's, for what both it and ``sc_workers`` export)."""

from __future__ import annotations

import sc_workers
from sc_dispatch import _public

PUBLIC_MODULES = [
    "sc_workers",
    "sc_workers.algos",
    "sc_workers.engine",
    "sc_workers.models",
    "sc_workers.rollout",
    "sc_workers.sync",
    "sc_workers.workers",
]


def test_these_are_the_public_modules() -> None:
    assert _public.public_modules("sc_workers") == PUBLIC_MODULES


def test_each_public_module_keeps_the_contract() -> None:
    assert _public.problems(PUBLIC_MODULES) == []


def test_configurations_still_read_their_field_types() -> None:
    # from_dict reads the annotations, which name types of the module that defines them
    config = sc_workers.CriticConfig.from_dict({"ppo_mini_batch_size": 4})
    assert config.ppo_mini_batch_size == 4
    assert sc_workers.CriticConfig.__module__ == "sc_workers"
    assert sc_workers.FSDPEngine.__module__ == "sc_workers.engine"
