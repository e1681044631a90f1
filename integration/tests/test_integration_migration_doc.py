"""The migration guide's differences table is honest: every sc exception it names exists in
some sc package and subclasses the builtin the row says it is, every sc name it tells a user
to import exists, and every verl test case that expects ``AssertionError`` has its row."""

from __future__ import annotations

import builtins
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guides" / "migrating-from-verl.md"
#: the public modules: each package's top level, then the second tiers
PACKAGES = [
    "sc_dispatch",
    "sc_protocol",
    "sc_core",
    "sc_ray",
    "sc_workers",
    "sc_trainer",
    "sc_dispatch.ext",
    "sc_dispatch.verl",
    "sc_core.backend",
    "sc_core.ext",
    "sc_core.verl",
    "sc_protocol.ext",
]


def _table() -> list[str]:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split("## Behaviour differences", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    return rows[2:]  # past the header and its rule


def _exported(name: str) -> type | None:
    for package in PACKAGES:
        value = getattr(importlib.import_module(package), name, None)
        if isinstance(value, type):
            return value
    return None


def test_the_table_has_one_row_per_difference_with_five_cells() -> None:
    rows = _table()
    assert len(rows) >= 50
    for row in rows:
        cells = [c.strip() for c in row.strip().strip("|").split(" | ")]
        assert len(cells) == 5, row
        assert all(cells), row


def test_every_error_named_with_its_builtin_subclasses_that_builtin() -> None:
    pairs = re.findall(r"`(\w+Error)` \(an? `(\w+)`\)", "\n".join(_table()))
    assert len(pairs) >= 20
    for name, builtin_name in pairs:
        if hasattr(builtins, name):
            continue
        cls = _exported(name)
        assert cls is not None, f"the guide names {name}, which no sc package exports"
        base = getattr(builtins, builtin_name)
        assert issubclass(cls, base), f"{name} is not a {builtin_name}"


@pytest.mark.parametrize(
    "case",
    [
        "`chunk(n)` of rows that do not divide",
        "`union_tensor_dict` / `union_numpy_dict`",
        "`from_dict(..., num_batch_dims=2)`",
        "`concat` of parts whose `meta_info` conflicts",
        "`set_dispatch_collect`",
        "`parallel_put([])`",
    ],
)
def test_each_verl_assertion_case_has_its_row(case: str) -> None:
    rows = [r for r in _table() if case in r]
    assert rows, f"no row for {case}"
    assert any("AssertionError" in r for r in rows)


def test_the_names_it_tells_users_to_import_exist() -> None:
    text = GUIDE.read_text(encoding="utf-8")
    for module, names in re.findall(r"`from (sc_[\w.]+) import ([\w, ]+)`", text):
        imported = importlib.import_module(module)
        for name in (n.strip() for n in names.split(",")):
            if name and name != "...":
                assert hasattr(imported, name), f"{module} has no {name}"
