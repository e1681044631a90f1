"""The trainer guide's listing of one step is the code's own: the Python block under "One
step, as the code reads" is ``RayPPOTrainer._train_step`` as it is in the source."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

from sc_trainer import RayPPOTrainer

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guides" / "trainer.md"
HEADING = "### One step, as the code reads"


def _listing() -> str:
    text = GUIDE.read_text(encoding="utf-8")
    section = text.split(HEADING, 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, f"no Python block under {HEADING!r} in {GUIDE}"
    return found.group(1)


def test_the_guide_shows_the_step_as_the_code_reads() -> None:
    source = textwrap.dedent(inspect.getsource(RayPPOTrainer._train_step))
    assert _listing() == source
