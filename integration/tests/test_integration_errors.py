"""The exception trees of all packages together: unique names, one builtin meaning each."""

from __future__ import annotations

import builtins
import importlib

import pytest

#: import name -> the package's base class name.
PACKAGES = {
    "sc_dispatch": "ScDispatchError",
    "sc_protocol": "ScProtocolError",
    "sc_core": "ScCoreError",
    "sc_ray": "ScRayError",
    "sc_workers": "ScWorkersError",
    "sc_rollout": "ScRolloutError",
    "sc_trainer": "ScTrainerError",
}
#: packages whose errors are exported by second tiers (of their concern, or an ``errors``
#: tier), besides the top
SECOND_TIERS = {
    "sc_rollout": ["sc_rollout.errors"],
    "sc_trainer": [
        f"sc_trainer.{sub}"
        for sub in (
            "agents",
            "config",
            "data",
            "faults",
            "launch",
            "loggers",
            "rewards",
            "rollout",
            "runs",
            "tasks",
            "trainer",
        )
    ],
}

_BUILTIN_ERRORS = {
    obj
    for obj in vars(builtins).values()
    if isinstance(obj, type) and issubclass(obj, BaseException)
} - {BaseException, Exception}


def _exported(package: str) -> dict[str, type[BaseException]]:
    """The exception classes ``package`` exports, at its top level or in a second tier."""
    found: dict[str, type[BaseException]] = {}
    for module_name in (package, *SECOND_TIERS.get(package, [])):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                assert found.setdefault(name, obj) is obj, f"two {name} in {package}"
    return found


def _meanings(exc: type[BaseException]) -> set[type[BaseException]]:
    """The most specific builtin exception types ``exc`` subclasses."""
    found = {b for b in exc.__mro__ if b in _BUILTIN_ERRORS}
    return {b for b in found if not any(o is not b and issubclass(o, b) for o in found)}


ALL = {module: _exported(module) for module in PACKAGES}


def test_class_names_are_unique_across_packages() -> None:
    owner: dict[str, tuple[str, type[BaseException]]] = {}
    for module, exported in ALL.items():
        for cls in exported.values():
            name = cls.__name__
            if name in owner:
                assert owner[name][1] is cls, f"{name} in {owner[name][0]} and {module}"
            owner[name] = (module, cls)


def test_exported_names_are_unique_across_packages() -> None:
    seen: dict[str, str] = {}
    for module, exported in ALL.items():
        for name in exported:
            assert name not in seen, f"{name} exported by {seen[name]} and {module}"
            seen[name] = module


@pytest.mark.parametrize("module", PACKAGES)
def test_one_base_per_package_and_one_builtin_per_class(module: str) -> None:
    exported = ALL[module]
    base = exported[PACKAGES[module]]
    assert base.__bases__ == (Exception,)
    assert _meanings(base) == set()
    for name, cls in exported.items():
        if cls is base:
            continue
        assert issubclass(cls, base), f"{module}.{name} is not a {base.__name__}"
        meanings = _meanings(cls)
        assert len(meanings) == 1, f"{module}.{name} means {sorted(m.__name__ for m in meanings)}"


@pytest.mark.parametrize("module", PACKAGES)
def test_tree_is_drawn_in_the_errors_module(module: str) -> None:
    doc = importlib.import_module(f"{module}._errors").__doc__ or ""
    for cls in ALL[module].values():
        assert cls.__name__ in doc, f"{cls.__name__} is missing from {module}._errors"


@pytest.mark.parametrize("module", list(SECOND_TIERS))
def test_every_error_of_the_tree_is_exported(module: str) -> None:
    """A package that exports its errors by concern leaves none of them private."""
    declared = set(importlib.import_module(f"{module}._errors").__all__)
    assert declared <= set(ALL[module]), sorted(declared - set(ALL[module]))
