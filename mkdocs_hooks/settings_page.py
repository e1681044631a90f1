"""mkdocs hook: fills docs/reference/settings.md with every environment variable sc reads.

Each package declares its variables in its private ``_settings.py`` and lists them in its
public ``SETTINGS`` tuple; this hook imports every package and replaces the marker on the page
with one table row per variable, so the page cannot fall behind the code.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from typing import Any

#: (distribution, import name) of every package that declares settings, in dependency order
#: (sc-dispatch reads none: it only provides the private framework, ``sc_dispatch._setting``).
PACKAGES: tuple[tuple[str, str], ...] = (
    ("sc-protocol", "sc_protocol"),
    ("sc-core", "sc_core"),
    ("sc-ray", "sc_ray"),
    ("sc-workers", "sc_workers"),
    ("sc-rollout", "sc_rollout"),
    ("sc-trainer", "sc_trainer"),
)
PAGE = "reference/settings.md"
MARKER = "<!-- settings-table -->"


def iter_settings() -> Iterator[tuple[str, Any]]:
    """``(distribution, setting)`` for every declared setting, package by package."""
    for dist, module_name in PACKAGES:
        module = importlib.import_module(module_name)
        for setting in module.SETTINGS:
            yield dist, setting


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`1`" if value else "`0`"
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`"


def render() -> str:
    """The Markdown table of every variable."""
    rows = [
        "| Variable | Package | Type | Default | What it does |",
        "|---|---|---|---|---|",
    ]
    for dist, s in iter_settings():
        rows.append(
            f"| `{s.name}` | {dist} | {s.type_name} | {_default(s.default)} | {_cell(s.doc)} |"
        )
    return "\n".join(rows) + "\n"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """mkdocs event: put the table on the settings page."""
    if page.file.src_uri != PAGE:
        return markdown
    if MARKER not in markdown:
        from mkdocs.exceptions import PluginError

        raise PluginError(f"{PAGE} lost its {MARKER} marker; the settings table goes there")
    return markdown.replace(MARKER, render())
