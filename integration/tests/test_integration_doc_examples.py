"""Every Python block of README.md, docs/ and the package READMEs runs as a reader would run
it (see ``sc_integration._doc_examples``): the blocks of a page in order, in one fresh
interpreter, from an empty folder. A block that cannot run here carries a
``<!-- docs-example: not run (why) -->`` marker, the only way out."""

from __future__ import annotations

from pathlib import Path

import pytest
from sc_integration._doc_examples import (
    DocExampleError,
    blocks,
    documented_pages,
    run_page,
)

ROOT = Path(__file__).resolve().parents[2]
PAGES = [page for page in documented_pages(ROOT) if blocks(page)]

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_the_examples_of_a_page_run(page: Path, tmp_path: Path) -> None:
    result = run_page(blocks(page), tmp_path, timeout=540)
    assert result.ok, f"{page.relative_to(ROOT)}:{result.failed_line} failed:\n{result.output}"


def test_the_pages_with_examples_are_found() -> None:
    names = {str(p.relative_to(ROOT)) for p in PAGES}
    assert {"docs/packages/sc-core.md", "packages/sc-core/README.md"} <= names
    assert sum(len(blocks(p)) for p in PAGES) >= 60


def test_a_broken_example_fails_at_its_line(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "# A page\n\n```python\nx = 1\n```\n\ntext\n\n- a list item:\n\n"
        "  ```python\n  y = x + 1\n  assert y == 3, y\n  ```\n",
    )
    found = blocks(page)
    assert [(b.line, b.code) for b in found] == [(4, "x = 1"), (12, "y = x + 1\nassert y == 3, y")]
    result = run_page(found, tmp_path)
    assert not result.ok
    assert result.failed_line == 12
    assert f'File "{page}", line 13' in result.output
    assert "AssertionError: 2" in result.output


def test_breaking_a_real_example_makes_its_page_fail(tmp_path: Path) -> None:
    source = ROOT / "packages" / "sc-dispatch" / "README.md"
    page = tmp_path / "README.md"
    page.write_text(
        source.read_text(encoding="utf-8").replace(
            "```python\n", "```python\nraise SystemExit(3)\n", 1
        ),
        encoding="utf-8",
    )
    result = run_page(blocks(page), tmp_path)
    assert (result.returncode, result.failed_line) == (1, blocks(page)[0].line)


def test_a_marked_block_is_not_run(tmp_path: Path) -> None:
    page = _page(
        tmp_path,
        "<!-- docs-example: not run (needs a CUDA device) -->\n"
        "```python\nraise SystemExit(1)\n```\n```py\nprint('ran')\n```\n",
    )
    found = blocks(page)
    assert [b.not_run for b in found] == ["needs a CUDA device", None]
    result = run_page(found, tmp_path)
    assert result.ok
    assert "ran" in result.output


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("<!-- docs-example: not run () -->\n```python\npass\n```\n", "with a reason"),
        ("<!-- docs-example: skip -->\n```python\npass\n```\n", "with a reason"),
        ("<!-- docs-example: not run (x) -->\n```bash\nls\n```\n", "above a bash block"),
        ("<!-- docs-example: not run (x) -->\nprose\n```python\npass\n```\n", "line 2 comes"),
        ("<!-- docs-example: not run (x) -->\n", "has no block"),
        ("```python\npass\n", "never closes"),
    ],
)
def test_a_marker_or_fence_that_cannot_be_read_is_an_error(
    text: str, match: str, tmp_path: Path
) -> None:
    page = _page(tmp_path, text)
    with pytest.raises(DocExampleError, match=match):
        blocks(page)


def _page(folder: Path, text: str) -> Path:
    """A Markdown page ``page.md`` in ``folder`` that reads ``text``."""
    page = folder / "page.md"
    page.write_text(text, encoding="utf-8")
    return page
