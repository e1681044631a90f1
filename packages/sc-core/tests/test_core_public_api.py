"""sc-core's tiers: the top level is what a user of workers and worker groups writes;
``sc_core.backend`` (the backend contract), ``sc_core.ext`` (span observers, fault actions,
worker-class rules) and ``sc_core.verl`` (verl's worker helpers) hold the rest. Each public
module keeps the contract of ``sc_dispatch._public``."""

from __future__ import annotations

import pickle
import typing

import sc_core
import sc_core.backend
from sc_dispatch import _public

#: sc_core.mypy_plugin is public too, but mypy imports it (mypy is no test dependency)
PUBLIC_MODULES = ["sc_core", "sc_core.backend", "sc_core.ext", "sc_core.verl"]


def test_these_are_the_public_modules() -> None:
    assert _public.public_modules("sc_core") == sorted([*PUBLIC_MODULES, "sc_core.mypy_plugin"])


def test_each_public_module_keeps_the_contract() -> None:
    # __all__ sorted and defined; every exported class and function names the public module
    # that exports it as its __module__, pickles by reference and resolves its annotations
    assert _public.problems(PUBLIC_MODULES) == []


def test_the_top_level_is_small() -> None:
    # 40, plus call ids (CallId, CallIds, CallRecord, StaleDriverError) and what a
    # re-attached driver reads of the journals (JournaledCall, TornCall)
    assert len(sc_core.__all__) <= 46
    assert sc_core.WorkerGroup.__module__ == "sc_core"
    assert sc_core.backend.Backend.__module__ == "sc_core.backend"


def test_a_users_worker_subclass_keeps_its_type_hints() -> None:
    class Actor(sc_core.Worker):
        steps: int

    assert typing.get_type_hints(Actor)["steps"] is int


def test_an_error_pickles_by_its_public_path() -> None:
    data = pickle.dumps(sc_core.WorkerGroupClosedError("closed"))
    assert b"sc_core" in data
    assert b"sc_core._errors" not in data
    assert isinstance(pickle.loads(data), sc_core.WorkerGroupClosedError)
