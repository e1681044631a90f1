"""The Python examples of the documentation, read and run as a reader would.

Every fenced ``python`` block of README.md, docs/**/*.md and packages/*/README.md runs: the
blocks of one page in order, in one fresh interpreter and one namespace (a later block may
use what an earlier one defined, as a reader following the page would), from an empty
working folder. A block that cannot run here (it needs a GPU, a standing cluster, a model
download) says so on the line above its fence, with the reason:

    <!-- docs-example: not run (needs a CUDA device) -->

That marker is the only way out, and its reason may not be empty.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterable
from pathlib import Path

__all__ = ["Block", "DocExampleError", "PageRun", "blocks", "documented_pages", "run_page"]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n`]*)$")
_MARKER = re.compile(r"^\s*<!--\s*docs-example:\s*(?P<body>.*?)\s*-->\s*$")
_NOT_RUN = re.compile(r"^not run\s*\((?P<reason>.*)\)$")


class DocExampleError(ValueError):
    """A page's markers or fences cannot be read: a marker without a reason, one that is
    not above a Python block, or a fence that never closes."""


@dataclasses.dataclass(frozen=True)
class Block:
    """One fenced Python block: its page, the line of its first code line (1-based), its
    code (dedented), and why it is not run (``None``: it runs)."""

    path: Path
    line: int
    code: str
    not_run: str | None = None


@dataclasses.dataclass(frozen=True)
class PageRun:
    """What running a page's blocks gave: the exit code, the block that failed (its line),
    and the interpreter's output."""

    returncode: int
    failed_line: int | None
    output: str

    @property
    def ok(self) -> bool:
        return self.returncode == 0


def documented_pages(root: Path) -> list[Path]:
    """README.md, every page under docs/ and every package README, sorted."""
    pages = [root / "README.md", *root.glob("docs/**/*.md"), *root.glob("packages/*/README.md")]
    return sorted(p for p in pages if p.is_file())


def blocks(path: Path) -> list[Block]:
    """The Python blocks of ``path`` in page order, each with its marker's reason."""
    lines = path.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    pending: tuple[int, str] | None = None  # a marker waiting for its block: line, reason
    i = 0
    while i < len(lines):
        marker = _MARKER.match(lines[i])
        if marker:
            pending = (i + 1, _reason(path, i + 1, marker.group("body")))
            i += 1
            continue
        fence = _FENCE.match(lines[i])
        if not fence:
            if lines[i].strip() and pending is not None:
                raise DocExampleError(
                    f"{path}:{pending[0]}: the docs-example marker is not directly above a "
                    f"python block (line {i + 1} comes between)"
                )
            i += 1
            continue
        end = _closing(lines, i, fence.group("fence"))
        if end is None:
            raise DocExampleError(f"{path}:{i + 1}: the fence {fence.group('fence')} never closes")
        language = fence.group("info").strip().split(" ")[0].lower()
        if language in ("python", "py"):
            code = textwrap.dedent("\n".join(lines[i + 1 : end]))
            found.append(Block(path, i + 2, code, pending[1] if pending else None))
        elif pending is not None:
            raise DocExampleError(
                f"{path}:{pending[0]}: the docs-example marker is above a {language or 'plain'} "
                "block; only python blocks run"
            )
        pending = None
        i = end + 1
    if pending is not None:
        raise DocExampleError(f"{path}:{pending[0]}: the docs-example marker has no block")
    return found


def _reason(path: Path, line: int, body: str) -> str:
    match = _NOT_RUN.match(body)
    if not match or not match.group("reason").strip():
        raise DocExampleError(
            f"{path}:{line}: a docs-example marker reads 'not run (<why>)' with a reason, "
            f"got {body!r}"
        )
    return match.group("reason").strip()


def _closing(lines: list[str], start: int, fence: str) -> int | None:
    for j in range(start + 1, len(lines)):
        stripped = lines[j].strip()
        if stripped.startswith(fence[0] * len(fence)) and not stripped.strip(fence[0]):
            return j
    return None


#: run in the page's interpreter: each block compiled under its page and line, so a
#: traceback points into the Markdown; the failing block's line printed for the caller
_RUNNER = """
import json, sys, traceback
blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "__main__"}
for path, line, code in blocks:
    try:
        exec(compile("\\n" * (line - 1) + code, path, "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"DOCS-EXAMPLE-FAILED {line}", flush=True)
        sys.exit(1)
"""


def run_page(
    page: Iterable[Block], cwd: Path, *, timeout: float = 300.0, env: dict[str, str] | None = None
) -> PageRun:
    """Run the page's blocks that are not marked, in order, in a fresh interpreter whose
    working folder is ``cwd``."""
    todo = [(str(b.path), b.line, b.code) for b in page if b.not_run is None]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER],
        input=json.dumps(todo),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )
    output = proc.stdout + proc.stderr
    failed = re.search(r"DOCS-EXAMPLE-FAILED (\d+)", output)
    return PageRun(proc.returncode, int(failed.group(1)) if failed else None, output)
