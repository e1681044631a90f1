"""Typed worker-group calls, checked by running the type checkers on the cases here.

- ``ok_call.py`` (the plugin-free spelling, ``wg.call(Worker.method, ...)``) must pass mypy
  with and without ``sc_core.mypy_plugin`` and pyright (strict);
- ``ok_plugin.py`` (the plain spelling, ``wg.method(...)``) must pass mypy with the plugin;
- in every ``bad_*.py`` each line preceded by a comment ``# expect: mypy=<code>
  pyright=<rule>`` must fail with exactly those error codes, and no other line may fail.

Run by the ``typing`` nox session (``uv run nox -s typing``), not by ``tests(sc-core)``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
WORKERS = "_typing_workers.py"
CALL_FILES = ["ok_call.py", "bad_call_arguments.py", "bad_call_arity.py", "bad_call_results.py"]
PLUGIN_FILES = ["ok_plugin.py", "bad_plugin.py"]
BAD_FILES = sorted(p.name for p in HERE.glob("bad_*.py"))

_EXPECT = re.compile(r"^\s*#\s*expect:(?P<spec>.*)$")
_MYPY_LINE = re.compile(r"^(?P<file>[\w.]+\.py):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")
_PYRIGHT_LINE = re.compile(r"^\s+.*?(?P<file>[\w.]+\.py):(?P<line>\d+):\d+ - error: ")
_PYRIGHT_RULE = re.compile(r"\((?P<rule>report\w+)\)\s*$")

Found = dict[str, set[tuple[int, str]]]


def expectations(name: str, tool: str) -> set[tuple[int, str]]:
    """``{(line, code)}`` that ``tool`` must report for the case file ``name``: each
    ``# expect:`` comment names the codes of the line below it."""
    found: set[tuple[int, str]] = set()
    lines = (HERE / name).read_text().splitlines()
    for number, text in enumerate(lines, start=1):
        match = _EXPECT.match(text)
        if match is None:
            continue
        for item in match.group("spec").split():
            key, _, code = item.partition("=")
            if key == tool:
                found.add((number + 1, code))
    return found


def same(found: set[tuple[int, str]], expected: set[tuple[int, str]], what: str) -> None:
    """Fail unless a checker reported exactly the expected ``(line, code)`` pairs."""
    if found != expected:
        pytest.fail(
            f"{what}: unexpected {sorted(found - expected)}, missing {sorted(expected - found)}"
        )


def _run(args: list[str], cache: Path) -> str:
    env = dict(os.environ, MYPY_CACHE_DIR=str(cache), NO_COLOR="1")
    proc = subprocess.run(
        args, cwd=HERE, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    return proc.stdout + proc.stderr


def _mypy(config: str, files: list[str], cache: Path) -> Found:
    out = _run(
        [sys.executable, "-m", "mypy", "--config-file", config, "--no-pretty", *files, WORKERS],
        cache,
    )
    if "INTERNAL ERROR" in out or "Traceback" in out:
        pytest.fail(f"mypy crashed:\n{out}")
    found: Found = {name: set() for name in [*files, WORKERS]}
    for line in out.splitlines():
        match = _MYPY_LINE.match(line)
        if match:
            found.setdefault(match["file"], set()).add((int(match["line"]), match["code"]))
    return found


def _pyright_executable() -> str:
    local = Path(sys.executable).with_name("pyright")
    found = str(local) if local.exists() else shutil.which("pyright")
    if found is None:
        pytest.fail("pyright is not installed (it is in the root 'typecheck' dependency group)")
    return found


@pytest.fixture(scope="module")
def mypy_with_plugin(tmp_path_factory: pytest.TempPathFactory) -> Found:
    files = [*CALL_FILES, *PLUGIN_FILES]
    return _mypy("mypy-plugin.ini", files, tmp_path_factory.mktemp("mypy-plugin"))


@pytest.fixture(scope="module")
def mypy_without_plugin(tmp_path_factory: pytest.TempPathFactory) -> Found:
    return _mypy("mypy-plain.ini", CALL_FILES, tmp_path_factory.mktemp("mypy-plain"))


@pytest.fixture(scope="module")
def pyright(tmp_path_factory: pytest.TempPathFactory) -> Found:
    out = _run(
        [_pyright_executable(), "--pythonpath", sys.executable, *CALL_FILES, WORKERS],
        tmp_path_factory.mktemp("pyright"),
    )
    found: Found = {name: set() for name in [*CALL_FILES, WORKERS]}
    current: tuple[str, int] | None = None
    for line in out.splitlines():
        head = _PYRIGHT_LINE.match(line)
        if head:
            current = (head["file"], int(head["line"]))
        rule = _PYRIGHT_RULE.search(line)
        if rule and current is not None:
            found.setdefault(current[0], set()).add((current[1], rule["rule"]))
            current = None
    if "0 errors" not in out and not any(found.values()):
        pytest.fail(f"could not read pyright's output:\n{out}")
    return found


def test_the_case_files_are_the_ones_listed() -> None:
    listed = {*CALL_FILES, *PLUGIN_FILES, WORKERS, Path(__file__).name}
    unlisted = {p.name for p in HERE.glob("*.py")} - listed
    if unlisted:
        pytest.fail(f"case files not checked: {sorted(unlisted)}")
    for name in BAD_FILES:
        if not expectations(name, "mypy"):
            pytest.fail(f"{name} marks no line with '# expect: mypy=...'")
        if name in CALL_FILES and not expectations(name, "pyright"):
            pytest.fail(f"{name} marks no line with '# expect: ... pyright=...'")


@pytest.mark.parametrize("name", [WORKERS, "ok_call.py", "ok_plugin.py"])
def test_correct_calls_pass_mypy_with_the_plugin(mypy_with_plugin: Found, name: str) -> None:
    same(mypy_with_plugin[name], set(), f"mypy (plugin) on {name}")


@pytest.mark.parametrize("name", [WORKERS, "ok_call.py"])
def test_correct_calls_pass_mypy_without_the_plugin(mypy_without_plugin: Found, name: str) -> None:
    same(mypy_without_plugin[name], set(), f"mypy on {name}")


@pytest.mark.parametrize("name", [WORKERS, "ok_call.py"])
def test_correct_calls_pass_pyright(pyright: Found, name: str) -> None:
    same(pyright[name], set(), f"pyright on {name}")


@pytest.mark.parametrize("name", BAD_FILES)
def test_misuses_fail_mypy_with_the_plugin(mypy_with_plugin: Found, name: str) -> None:
    same(mypy_with_plugin[name], expectations(name, "mypy"), f"mypy (plugin) on {name}")


@pytest.mark.parametrize("name", [n for n in BAD_FILES if n in CALL_FILES])
def test_misuses_fail_mypy_without_the_plugin(mypy_without_plugin: Found, name: str) -> None:
    same(mypy_without_plugin[name], expectations(name, "mypy"), f"mypy on {name}")


@pytest.mark.parametrize("name", [n for n in BAD_FILES if n in CALL_FILES])
def test_misuses_fail_pyright(pyright: Found, name: str) -> None:
    same(pyright[name], expectations(name, "pyright"), f"pyright on {name}")


def test_without_the_plugin_the_plain_spelling_is_untyped(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Without the plugin every misuse of bad_plugin.py passes unnoticed: the bound methods
    # come from WorkerGroup.__getattr__, typed Any.
    found = _mypy("mypy-plain.ini", ["bad_plugin.py"], tmp_path_factory.mktemp("mypy-off"))
    same(found["bad_plugin.py"], set(), "mypy without the plugin on bad_plugin.py")
