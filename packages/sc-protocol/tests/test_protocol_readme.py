"""The examples in the package README and the docs page run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

_PACKAGE = Path(__file__).resolve().parents[1]
_DOCS = _PACKAGE.parents[1] / "docs" / "packages" / "sc-protocol.md"


def _first_python_block(path: Path) -> str:
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)
    assert blocks, f"no python example in {path}"
    return str(blocks[0])


def test_readme_example_runs() -> None:
    exec(compile(_first_python_block(_PACKAGE / "README.md"), "README.md", "exec"), {})


@pytest.mark.skipif(not _DOCS.exists(), reason="docs are not shipped with the package")
def test_docs_example_runs() -> None:
    exec(compile(_first_python_block(_DOCS), "sc-protocol.md", "exec"), {})
