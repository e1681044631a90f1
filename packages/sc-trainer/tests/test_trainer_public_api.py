"""sc-trainer's public API keeps the contract of ``sc_dispatch._public``: a small top level,
one second tier per concern, errors exported where their concern is, the environment
variables declared once, and the dependencies it imports declared."""

from __future__ import annotations

import pickle
import re
import types
from importlib.metadata import requires, version

import pytest
import sc_trainer
from sc_dispatch import _public

SECOND_TIERS = [
    "sc_trainer.agents",
    "sc_trainer.cli",
    "sc_trainer.config",
    "sc_trainer.data",
    "sc_trainer.evaluation",
    "sc_trainer.faults",
    "sc_trainer.launch",
    "sc_trainer.loggers",
    "sc_trainer.rewards",
    "sc_trainer.rollout",
    "sc_trainer.runs",
    "sc_trainer.tasks",
    "sc_trainer.testing",
    "sc_trainer.trainer",
]


def test_the_public_modules_keep_the_contract() -> None:
    assert _public.public_modules("sc_trainer") == ["sc_trainer", *SECOND_TIERS]
    # __all__ sorted and defined; every exported class and function names a module that
    # exports it as its __module__, pickles by reference and resolves its annotations
    assert _public.problems(["sc_trainer", *SECOND_TIERS]) == []
    assert sc_trainer.RayPPOTrainer.__module__ == "sc_trainer.trainer"
    assert sc_trainer.RolloutSource.__module__ == "sc_trainer.rollout"


def test_the_top_level_is_small_and_every_public_name_is_exported() -> None:
    assert len(sc_trainer.__all__) <= 25
    public = {n for n in dir(sc_trainer) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if isinstance(getattr(sc_trainer, n), types.ModuleType)}
    assert modules <= {m.rpartition(".")[2] for m in SECOND_TIERS}
    assert public - modules == set(sc_trainer.__all__) - {"__version__"}


def test_an_error_pickles_by_its_public_path() -> None:
    from sc_trainer.rollout import StalenessBoundError

    data = pickle.dumps(StalenessBoundError("behind"))
    assert b"sc_trainer._errors" not in data
    assert isinstance(pickle.loads(data), StalenessBoundError)


def test_the_version_and_the_declared_dependencies() -> None:
    assert version("sc-trainer") == sc_trainer.__version__
    names = {re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in requires("sc-trainer") or []}
    assert {"sc-core", "sc-ray", "sc-workers", "sc-rollout", "ray", "torch"} <= names
    assert "matplotlib" in names  # as the extra plot: "matplotlib...; extra == 'plot'"


def test_the_settings_are_declared_once_with_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = ["SC_TRAINER_WORKER_LOGS", "SC_TRAINER_LOST_PEER_GRACE_S"]
    assert [s.name for s in sc_trainer.SETTINGS] == names
    for name in names:
        monkeypatch.delenv(name, raising=False)
    assert [s.get() for s in sc_trainer.SETTINGS] == [False, 60.0]
