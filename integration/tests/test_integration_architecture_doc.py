"""The architecture page draws sc-core's and sc-ray's modules: every module it names exists,
and every module of the two packages is named on it."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "sc_core": ROOT / "packages" / "sc-core" / "src" / "sc_core",
    "sc_ray": ROOT / "packages" / "sc-ray" / "src" / "sc_ray",
}


def _modules() -> set[str]:
    names: set[str] = set()
    for root in PACKAGES.values():
        for path in root.iterdir():
            if path.name == "__init__.py" or path.name.startswith("."):
                continue
            if path.suffix == ".py":
                names.add(path.name)
            elif path.is_dir() and (path / "__init__.py").exists():
                names.add(f"{path.name}/")
    return names


def _named_on_page() -> set[str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    return set(re.findall(r"\b(_?[a-z][a-z_]*\.py|_[a-z_]+/)", text))


def test_every_module_is_on_the_architecture_page() -> None:
    missing = sorted(_modules() - _named_on_page())
    assert not missing, f"docs/architecture.md does not name {missing}"


def test_every_module_on_the_page_exists() -> None:
    unknown = sorted(_named_on_page() - _modules() - {"pyproject.toml"})
    assert not unknown, f"docs/architecture.md names modules that do not exist: {unknown}"
