"""Every SC_* environment variable is declared once, read through its Setting, and documented.

The source scan looks for ``"SC_..."`` string literals in code (not docstrings) of every
package's ``src`` outside ``_settings.py``: a literal there is a direct read (or a name kept
in step by hand). Reads in files that another change is restructuring are listed in
``PENDING_DIRECT_READS`` with the Setting that replaces each; the list may only shrink: an
entry that no longer matches a literal fails, so delete it when the read is wired.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE_ROOTS = (
    *sorted((ROOT / "packages").glob("*/src")),
    ROOT / "integration" / "src",
    *sorted((ROOT / "integration").glob("sc-ext-*/src")),
)
_ENV_NAME = re.compile(r"SC_[A-Z0-9_]+")

#: (file, variable) -> the Setting to read instead. Temporary: the integrator empties it.
PENDING_DIRECT_READS: dict[tuple[str, str], str] = {}

#: Names outside the SC_<PACKAGE>_ convention, with the reason.
CONVENTION_EXCEPTIONS = {
    # Backend contract, reserved by sc-ray's RESERVED_ENV_VARS (code from the environment):
    # renaming it needs the reserved list to change in the same commit.
    "SC_RENDEZVOUS",
}

_PREFIX = {
    "sc-dispatch": "SC_DISPATCH_",
    "sc-protocol": "SC_PROTOCOL_",
    "sc-core": "SC_CORE_",
    "sc-ray": "SC_RAY_",
    "sc-workers": "SC_WORKERS_",
    "sc-rollout": "SC_ROLLOUT_",
    "sc-trainer": "SC_TRAINER_",
}


def _hook() -> ModuleType:
    path = ROOT / "mkdocs_hooks" / "settings_page.py"
    spec = importlib.util.spec_from_file_location("_sc_settings_page_hook", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _docstring_positions(tree: ast.AST) -> set[tuple[int, int]]:
    """(line, column) of every docstring: prose, not a read."""
    found: set[tuple[int, int]] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add((body[0].value.lineno, body[0].value.col_offset))
    return found


def _direct_reads() -> Iterator[tuple[str, str, int]]:
    for src in SOURCE_ROOTS:
        for path in sorted(src.rglob("*.py")):
            if path.name == "_settings.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            docstrings = _docstring_positions(tree)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant)
                    and isinstance(node.value, str)
                    and (node.lineno, node.col_offset) not in docstrings
                    and _ENV_NAME.fullmatch(node.value)
                ):
                    yield path.relative_to(ROOT).as_posix(), node.value, node.lineno


def _declared() -> list[tuple[str, Any]]:
    return list(_hook().iter_settings())


def test_no_direct_reads_of_sc_variables_outside_settings_modules() -> None:
    found = list(_direct_reads())
    unexpected = [
        f"{p}:{line}: {name}" for p, name, line in found if (p, name) not in PENDING_DIRECT_READS
    ]
    assert not unexpected, (
        "read these through the package's _settings.py Setting (sc_dispatch._setting.Setting.get): "
        + "; ".join(unexpected)
    )
    stale = sorted(set(PENDING_DIRECT_READS) - {(p, name) for p, name, _ in found})
    assert not stale, f"wired already: remove from PENDING_DIRECT_READS: {stale}"


def test_pending_reads_name_declared_settings() -> None:
    declared = {name for _, s in _declared() for name in s.names}
    for _, variable in PENDING_DIRECT_READS:
        assert variable in declared, variable


def test_every_package_with_settings_is_on_the_docs_page() -> None:
    hook = _hook()
    with_settings = {p.parent.name for src in SOURCE_ROOTS for p in src.glob("*/_settings.py")}
    listed = {module for _, module in hook.PACKAGES}
    assert with_settings <= listed
    page = (ROOT / "docs" / "reference" / "settings.md").read_text(encoding="utf-8")
    assert hook.MARKER in page
    table = hook.render()
    for dist, setting in _declared():
        row = next(line for line in table.splitlines() if f"`{setting.name}`" in line)
        assert dist in row
        assert not setting.deprecated, f"{setting.name} keeps former names: {setting.deprecated}"


def test_names_are_unique_and_follow_the_convention() -> None:
    declared = _declared()
    names = [s.name for _, s in declared]
    assert len(names) == len(set(names)), names
    for dist, s in declared:
        if s.name in CONVENTION_EXCEPTIONS:
            continue
        assert s.name.startswith(_PREFIX[dist]), (dist, s.name)
        assert (s.type_name == "seconds") == s.name.endswith("_S"), s.name


@pytest.mark.parametrize("module", ["sc_protocol", "sc_core", "sc_ray", "sc_workers", "sc_rollout"])
def test_settings_are_public(module: str) -> None:
    mod = importlib.import_module(module)
    assert "SETTINGS" in mod.__all__
    assert all(type(s).__name__ == "Setting" for s in mod.SETTINGS)
