"""No import cycles and no function-local imports, in every package of the workspace (issue 24).

Every module of every package (``packages/*/src/<pkg>``, ``integration/src/<pkg>``,
``integration/*/src/<pkg>``) is parsed with ``ast``, nothing is imported. The import graph
between the modules of one package counts every import: at module level, under
``if TYPE_CHECKING:``, inside functions, and ``importlib.import_module`` / ``__import__`` of a
literal name. Relative imports are resolved (``from . import _a``, ``from ._a import b``,
``from .. import x``); ``from pkg.sub import name`` is an edge to ``pkg.sub.name`` when that is
a module, else to ``pkg.sub``.

* No cycle: a module that needs a type from a module that needs it back moves the type to a
  leaf module, or takes the thing as a parameter.
* No import inside a function, except of another distribution that is heavy and not needed
  where the module is imported (``LAZY_IMPORTS``, each with its reason); never of a module of
  the same package.

sc-core and sc-dispatch are being refactored: what they have today is listed in the
``*_FOR_REFACTOR`` allow-lists, which may only shrink (an entry that no longer occurs fails
the test until it is removed).
"""

from __future__ import annotations

import ast
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

#: Imports inside a function kept on purpose, as (module, imported distribution's top-level
#: package): each heavy and not needed where the module is imported.
LAZY_IMPORTS: dict[tuple[str, str], str] = {
    ("sc_ray._proto_futures", "sc_protocol"): (
        "sc-protocol imports torch; importing sc_ray imports neither (test_ray_unit)"
    ),
    ("sc_ray._wire", "sc_protocol"): "as sc_ray._proto_futures: sc_ray's import stays light",
    ("sc_ray._wire", "tensordict"): "as sc_ray._proto_futures: sc_ray's import stays light",
    ("sc_protocol._tensordict", "tensordict"): (
        "tensordict is imported once, with torch.compile's marks deferred (see the module)"
    ),
    ("sc_workers.models._hf", "transformers"): "the optional extra sc-workers[hf]",
    ("sc_workers.models._hf_stage", "transformers"): (
        "as sc_workers.models._hf: only a pipelined Hugging Face model needs its mask builders"
    ),
    ("sc_workers.models._hf_ulysses", "transformers"): (
        "as sc_workers.models._hf: only Ulysses on a Hugging Face model wraps its attention"
    ),
    ("sc_workers.engine._pipeline", "torch"): (
        "torch.distributed.pipelining imports dynamo and sympy (about 2 s of every worker "
        "process): only a pipeline schedule needs it (test_workers_imports)"
    ),
    ("sc_workers.rollout._weights", "safetensors"): (
        "the optional extra sc-workers[hf], as transformers: only the built-in engine reads it"
    ),
    ("sc_rollout.engines._vllm", "vllm"): (
        "vLLM lives in an environment of its own: only the vLLM server process imports it"
    ),
    (
        "sc_rollout.engines._vllm_env",
        "uv",
    ): "the uv package, where no uv is on the path, to make vLLM's environment",
    ("sc_trainer.tasks._tiny_gpt2", "transformers"): (
        "as sc_workers.models._hf: only a run that builds its tiny GPT-2 imports transformers"
    ),
    ("sc_trainer.tasks._tiny_gpt2", "tokenizers"): "as transformers, for the model's tokenizer",
    ("sc_trainer.launch._launchers", "ray"): (
        "only the Ray backend imports Ray, after setting RAY_ENABLE_UV_RUN_RUNTIME_ENV, "
        "which Ray reads when it is first imported"
    ),
    ("sc_trainer.launch._launchers", "sc_ray"): "imports Ray: as ray above",
    ("sc_trainer.launch._connect", "ray"): (
        "as sc_trainer.launch._launchers, after deciding RAY_AUTH_MODE, which Ray reads when "
        "it is first imported"
    ),
    ("sc_trainer.cli._errors", "sc_ray"): (
        "imports Ray: sc-demo catches sc-ray's errors only once one came, after the launcher "
        "set RAY_ENABLE_UV_RUN_RUNTIME_ENV"
    ),
    ("sc_trainer.rollout._fleet_ray", "ray"): (
        "as sc_trainer.launch._launchers: the rollout-server fleet imports Ray on first use, so "
        "importing sc_trainer does not"
    ),
    ("sc_trainer.rollout._fleet_ray", "sc_ray"): "imports Ray: as ray above",
    ("sc_trainer.faults._injected", "sc_ray"): (
        "imports Ray: only a run with a node fault (node@step=N) arms sc-ray's NodeLoss"
    ),
    ("sc_trainer.rollout._server_actor", "ray"): (
        "runs in a rollout server's Ray actor, where Ray is loaded; importing sc_trainer "
        "does not import Ray"
    ),
    ("sc_trainer.runs._output", "matplotlib"): (
        "only the end of a run draws the plot, and matplotlib is the extra sc-trainer[plot]"
    ),
    ("sc_trainer.loggers._tensorboard", "tensorboard"): (
        "the extra sc-trainer[tensorboard]: only a run with the tensorboard tracker needs it"
    ),
    ("sc_trainer.loggers._tensorboard", "torch"): (
        "torch.utils.tensorboard imports tensorboard (the extra above): imported with it"
    ),
    ("sc_trainer.loggers._wandb", "wandb"): (
        "the extra sc-trainer[wandb]: only a run with the wandb tracker imports it"
    ),
    ("sc_trainer.loggers._mlflow", "mlflow"): (
        "the extra sc-trainer[mlflow]: only a run with the mlflow tracker imports it, after "
        "setting the variables MLflow reads when it is first imported"
    ),
}


@dataclass(frozen=True)
class Import:
    """One import in module ``module`` (line ``line``) of ``target``, a dotted name."""

    module: str
    line: int
    target: str
    in_function: bool


@dataclass(frozen=True)
class Module:
    name: str
    path: Path
    is_package: bool
    tree: ast.Module


def packages() -> dict[str, Path]:
    """Every import package of the workspace, by name, with its directory."""
    found: dict[str, Path] = {}
    for pattern in ("packages/*/src/*/__init__.py", "integration/src/*/__init__.py"):
        for init in sorted(ROOT.glob(pattern)):
            found[init.parent.name] = init.parent
    for init in sorted(ROOT.glob("integration/*/src/*/__init__.py")):
        found[init.parent.name] = init.parent
    return found


def load(package: str, root: Path) -> dict[str, Module]:
    """Every module of ``package`` (rooted at ``root``), parsed, by dotted name."""
    modules: dict[str, Module] = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join((package, *(parts[:-1] if is_package else parts)))
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        modules[name] = Module(name, path, is_package, tree)
    return modules


def _from_base(module: Module, node: ast.ImportFrom) -> str:
    """The absolute module a ``from ... import`` reads from."""
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join([*base, *([node.module] if node.module else [])])


def _literal_import(node: ast.Call) -> str | None:
    """The name ``importlib.import_module("x")`` / ``__import__("x")`` imports, if literal."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in {"import_module", "__import__"} or not node.args:
        return None
    first = node.args[0]
    if isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


def imports(module: Module, known: Iterable[str]) -> Iterator[Import]:
    """Every import in ``module``: its absolute target, and whether it is inside a function."""
    names = set(known)

    def visit(node: ast.AST, in_function: bool) -> Iterator[Import]:
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(module.name, node.lineno, alias.name, in_function)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = _from_base(module, node)
            for alias in node.names:
                full = f"{base}.{alias.name}"
                yield Import(module.name, node.lineno, full if full in names else base, in_function)
        elif isinstance(node, ast.Call):
            literal = _literal_import(node)
            if literal is not None and not literal.startswith("."):
                yield Import(module.name, node.lineno, literal, in_function)
        inner = in_function or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        for child in ast.iter_child_nodes(node):
            yield from visit(child, inner)

    yield from visit(module.tree, False)


def _owner(target: str, modules: dict[str, Module]) -> str | None:
    """The module of the package that importing ``target`` runs (its longest known prefix)."""
    parts = target.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules:
            return name
        parts.pop()
    return None


def import_graph(modules: dict[str, Module]) -> dict[str, set[str]]:
    """Module to the modules of the same package it imports, anywhere in it."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, module in modules.items():
        for found in imports(module, modules):
            owner = _owner(found.target, modules)
            if owner is not None and owner != name:
                graph[name].add(owner)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of ``graph`` with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(component)

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _shortest_path(
    graph: dict[str, set[str]], start: str, goal: str, within: set[str]
) -> list[str]:
    previous: dict[str, str | None] = {start: None}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        if node == goal:
            path = [node]
            while (back := previous[path[-1]]) is not None:
                path.append(back)
            return path[::-1]
        for nxt in sorted(graph[node] & within):
            if nxt not in previous:
                previous[nxt] = node
                queue.append(nxt)
    return []


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Import cycles covering every import edge that lies on a cycle: for each such edge
    ``a -> b``, ``a -> b -> ... -> a`` along a shortest way back (each cycle listed once,
    starting at its smallest module, the first module repeated at the end)."""
    found: set[tuple[str, ...]] = set()
    for component in strongly_connected(graph):
        for start in sorted(component):
            for nxt in sorted(graph[start] & component):
                ring = [start, *_shortest_path(graph, nxt, start, component)[:-1]]
                first = ring.index(min(ring))
                found.add(tuple(ring[first:] + ring[:first]))
    return [[*ring, ring[0]] for ring in sorted(found)]


def _describe(rings: Iterable[list[str]]) -> str:
    return "\n".join("  " + " -> ".join(ring) for ring in rings)


PACKAGES = packages()


def test_every_package_of_the_workspace_is_read() -> None:
    """Every source package in the tree is checked (a member whose sources sit where
    ``packages()`` does not look would escape every check here)."""
    tops = [d for d in ROOT.iterdir() if d.is_dir() and not d.name.startswith(".")]
    expected = {init.parent.name for top in tops for init in top.glob("**/src/*/__init__.py")}
    assert len(expected) >= 8
    assert expected <= set(PACKAGES)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_cycle(package: str) -> None:
    graph = import_graph(load(package, PACKAGES[package]))
    found = cycles(graph)
    assert not found, f"{package} has import cycles (move shared types to a leaf module):\n" + (
        _describe(found)
    )


def _local_imports(package: str) -> list[Import]:
    modules = load(package, PACKAGES[package])
    return [
        found
        for module in modules.values()
        for found in imports(module, modules)
        if found.in_function
    ]


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_no_import_of_the_same_package_inside_a_function(package: str) -> None:
    found = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in _local_imports(package)
        if i.target.split(".")[0] == package
    ]
    assert not found, f"imports inside a function of {package}'s own modules:\n" + "\n".join(found)


@pytest.mark.parametrize("package", sorted(PACKAGES))
def test_imports_of_other_distributions_inside_a_function_are_listed(package: str) -> None:
    found = [
        f"{i.module}:{i.line} imports {i.target}"
        for i in _local_imports(package)
        if i.target.split(".")[0] != package
        and (i.module, i.target.split(".")[0]) not in LAZY_IMPORTS
    ]
    assert not found, (
        "imports inside a function (move them to the top of the module, or list a heavy one "
        "in LAZY_IMPORTS with its reason):\n" + "\n".join(found)
    )


def test_lazy_imports_are_of_other_distributions_and_still_there() -> None:
    same = [key for key in LAZY_IMPORTS if key[0].split(".")[0] == key[1]]
    assert not same, f"a module of the same package is never imported lazily: {same}"
    current = {
        (i.module, i.target.split(".")[0]) for package in PACKAGES for i in _local_imports(package)
    }
    stale = sorted(set(LAZY_IMPORTS) - current)
    assert not stale, f"{stale} are gone: remove them from LAZY_IMPORTS"


# --- the reader itself ------------------------------------------------------------------------

_SOURCES = {
    "p": "from . import _a\nfrom ._b import thing\n",
    "p._a": (
        "from typing import TYPE_CHECKING\nimport os\nif TYPE_CHECKING:\n    from p._c import C\n"
    ),
    "p._b": "def f():\n    from ._a import x\n    import numpy\n",
    "p._c": "import importlib\nmod = importlib.import_module('p.sub._d')\n",
    "p.sub": "from .. import _b\n",
    "p.sub._d": "from ..sub import _e\nfrom .._c import y\n",
    "p.sub._e": "",
}


def _fake_package() -> dict[str, Module]:
    return {
        name: Module(name, Path(f"{name}.py"), name in {"p", "p.sub"}, ast.parse(source))
        for name, source in _SOURCES.items()
    }


def test_the_graph_reads_relative_type_only_local_and_literal_imports() -> None:
    graph = import_graph(_fake_package())
    assert graph == {
        "p": {"p._a", "p._b"},
        "p._a": {"p._c"},
        "p._b": {"p._a"},
        "p._c": {"p.sub._d"},
        "p.sub": {"p._b"},
        "p.sub._d": {"p.sub._e", "p._c"},
        "p.sub._e": set(),
    }
    local = [i for m in _fake_package().values() for i in imports(m, _SOURCES) if i.in_function]
    assert [(i.module, i.target) for i in local] == [("p._b", "p._a"), ("p._b", "numpy")]


def test_cycles_cover_every_edge_on_a_cycle() -> None:
    assert cycles(import_graph(_fake_package())) == [["p._c", "p.sub._d", "p._c"]]
    graph = {"a": {"b"}, "b": {"a", "c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "a"], ["a", "b", "c", "a"]]
    assert strongly_connected(graph) == [{"a", "b", "c"}]
