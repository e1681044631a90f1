"""sc-rollout's public API keeps the contract of ``sc_dispatch._public``, depends on
sc-dispatch alone, and declares its environment variables once."""

from __future__ import annotations

import importlib.util
import os
import pickle
import re
import types
from importlib.metadata import requires, version

import pytest
import sc_rollout
from sc_dispatch import _public

SECOND_TIERS = [
    "sc_rollout.agents",
    "sc_rollout.chat",
    "sc_rollout.engines",
    "sc_rollout.errors",
    "sc_rollout.routing",
    "sc_rollout.serving",
    "sc_rollout.testing",
]


def test_the_public_modules_keep_the_contract() -> None:
    assert _public.public_modules("sc_rollout") == ["sc_rollout", *SECOND_TIERS]
    # __all__ sorted and defined; every exported class and function names a module that
    # exports it as its __module__, pickles by reference and resolves its annotations
    assert _public.problems(["sc_rollout", *SECOND_TIERS]) == []
    assert sc_rollout.Router.__module__ == "sc_rollout.routing"
    assert sc_rollout.ScRolloutError.__module__ == "sc_rollout.errors"


def test_the_top_level_is_small_and_every_public_name_is_exported() -> None:
    assert len(sc_rollout.__all__) <= 25
    # (``annotations`` is the ``from __future__`` feature, not a name of the package)
    public = {n for n in dir(sc_rollout) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if isinstance(getattr(sc_rollout, n), types.ModuleType)}
    assert modules <= {m.rpartition(".")[2] for m in SECOND_TIERS}
    assert public - modules == set(sc_rollout.__all__) - {"__version__"}


def test_every_error_is_in_the_errors_tier() -> None:
    from sc_rollout import _errors

    assert sorted(_errors.__all__) == sc_rollout.errors.__all__


def test_an_error_pickles_by_its_public_path() -> None:
    data = pickle.dumps(sc_rollout.errors.PromptTooLongError("too long"))
    assert b"sc_rollout._errors" not in data
    assert isinstance(pickle.loads(data), sc_rollout.errors.PromptTooLongError)


def test_depends_on_sc_dispatch_only() -> None:
    assert version("sc-rollout") == sc_rollout.__version__
    names = [re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0] for r in requires("sc-rollout") or []]
    assert names == ["sc-dispatch"]


@pytest.mark.skipif(
    os.environ.get("SC_ISOLATED_PACKAGE") != "sc-rollout",
    reason="only meaningful in the isolated tests(sc-rollout) nox session",
)
@pytest.mark.parametrize("name", ["torch", "numpy", "ray", "vllm", "sc_core"])
def test_heavy_dependencies_are_not_installed(name: str) -> None:
    assert importlib.util.find_spec(name) is None


def test_the_settings_are_declared_once_with_their_defaults(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    names = [s.name for s in sc_rollout.SETTINGS]
    assert names == [
        "SC_ROLLOUT_HOST",
        "SC_ROLLOUT_REQUEST_TIMEOUT_S",
        "SC_ROLLOUT_HEALTH_TIMEOUT_S",
        "SC_ROLLOUT_START_TIMEOUT_S",
        "SC_ROLLOUT_VLLM_ENV",
        "SC_ROLLOUT_VLLM_START_TIMEOUT_S",
    ]
    for setting in sc_rollout.SETTINGS:
        monkeypatch.delenv(setting.name, raising=False)
    assert [s.get() for s in sc_rollout.SETTINGS] == ["127.0.0.1", 600.0, 5.0, 300.0, "", 900.0]
    monkeypatch.setenv("SC_ROLLOUT_HEALTH_TIMEOUT_S", "-1")
    with pytest.raises(ValueError, match="SC_ROLLOUT_HEALTH_TIMEOUT_S='-1'"):
        sc_rollout.Router()
