"""The module structure of sc_protocol (issue 24): DataProto's helpers work on plain columns
and never import it back, no import hides inside a function or a ``TYPE_CHECKING`` block,
and the module import graph has no cycle."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import sc_protocol

PACKAGE = Path(sc_protocol.__file__).resolve().parent
NAME = "sc_protocol"

#: The modules about DataProto as a whole, which may import it (none is imported by it).
MAY_IMPORT_DATA_PROTO = {
    "__init__",
    "_adapters",
    "_collate",
    "_deferred",
    "_fold",
    "_future",
    "_padding",
    "_resolve",
}


def _modules() -> dict[str, ast.Module]:
    return {
        path.stem: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for path in sorted(PACKAGE.glob("*.py"))
    }


def _imported(module: str, node: ast.Import | ast.ImportFrom) -> set[str]:
    """The sc_protocol modules that ``node`` (in ``module``) imports."""
    found: set[str] = set()
    if isinstance(node, ast.Import):
        for alias in node.names:
            parts = alias.name.split(".")
            if parts[0] == NAME:
                found.add(parts[1] if len(parts) > 1 else "__init__")
        return found
    if node.level == 0:
        parts = (node.module or "").split(".")
        if parts[0] != NAME:
            return found
        relative = parts[1:]
    elif node.level == 1:
        relative = (node.module or "").split(".") if node.module else []
    else:
        return found
    if relative:
        found.add(relative[0])
    else:  # ``from . import _rows``: each name is a module
        found.update(alias.name for alias in node.names)
    return found


def import_graph(modules: dict[str, ast.Module]) -> dict[str, set[str]]:
    """Module name to the sc_protocol modules it imports anywhere (type-only ones included)."""
    graph: dict[str, set[str]] = {}
    for name, tree in modules.items():
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                edges |= _imported(name, node) & modules.keys()
        edges.discard(name)
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order, the first repeated), or None."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(node: str) -> list[str] | None:
        path.append(node)
        on_path.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt in on_path:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in done:
                cycle = visit(nxt)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(node)
        done.add(node)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_the_package_has_the_modules_this_test_reads() -> None:
    modules = _modules()
    assert {"_data_proto", "_rows", "_keys", "_union", "_convert", "__init__"} <= set(modules)


def test_only_modules_about_dataproto_as_a_whole_import_it() -> None:
    graph = import_graph(_modules())
    importers = {name for name, edges in graph.items() if "_data_proto" in edges}
    assert importers <= MAY_IMPORT_DATA_PROTO, sorted(importers - MAY_IMPORT_DATA_PROTO)


def test_dataproto_imports_none_of_the_modules_that_import_it() -> None:
    graph = import_graph(_modules())
    assert not graph["_data_proto"] & MAY_IMPORT_DATA_PROTO


def test_every_import_is_at_module_level() -> None:
    misplaced: list[str] = []
    for name, tree in _modules().items():
        top = {id(node) for node in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in top:
                misplaced.append(f"{name}.py:{node.lineno}")
    assert misplaced == []


def test_no_module_has_a_type_checking_block() -> None:
    found = [
        f"{name}.py:{node.lineno}"
        for name, tree in _modules().items()
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id == "TYPE_CHECKING")
        or (isinstance(node, ast.Attribute) and node.attr == "TYPE_CHECKING")
        or (
            isinstance(node, ast.ImportFrom)
            and any(alias.name == "TYPE_CHECKING" for alias in node.names)
        )
    ]
    assert found == []


def test_the_module_import_graph_has_no_cycle() -> None:
    graph = import_graph(_modules())
    assert find_cycle(graph) is None


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"a"}}, ["a", "b", "a"]),
        ({"a": {"b"}, "b": {"c"}, "c": {"b"}}, ["b", "c", "b"]),
    ],
)
def test_find_cycle_reports_the_cycle(
    graph: dict[str, set[str]], expected: list[str] | None
) -> None:
    assert find_cycle(graph) == expected


def test_import_graph_reads_relative_absolute_and_package_imports() -> None:
    source = (
        "import sc_protocol._rows\n"
        "from sc_protocol._keys import select_columns\n"
        "from . import _union, _convert\n"
        "from ._columns import NDArray\n"
        "import numpy\n"
        "def f():\n"
        "    from ._disk import save_columns\n"
    )
    names = ["m", "_rows", "_keys", "_union", "_convert", "_columns", "_disk"]
    modules = {name: ast.parse("") for name in names}
    modules["m"] = ast.parse(source)
    assert import_graph(modules)["m"] == {
        "_rows",
        "_keys",
        "_union",
        "_convert",
        "_columns",
        "_disk",
    }
