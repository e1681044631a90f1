"""The trainer guides agree with the code: the Python block under "One step, as the code
reads" is ``RayPPOTrainer._train_step`` as it is in the source, and the your-own-task guide's
table lists every key of a config file with the field it sets."""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path

from sc_trainer import RayPPOTrainer
from sc_trainer.config import KEYS

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


def test_the_own_task_guide_lists_every_config_key() -> None:
    """Its key table has a row per key of the config file, naming the field the key sets."""
    text = (GUIDE.parent / "your-own-task.md").read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line.startswith("| `")]
    rows = {line.split("|")[1].strip(" `"): line for line in lines}
    missing = [key.name for key in KEYS if key.name not in rows]
    assert not missing, f"docs/guides/your-own-task.md lacks the keys {missing}"
    wrong = [key.name for key in KEYS if key.field and f"`{key.field}`" not in rows[key.name]]
    assert not wrong, f"docs/guides/your-own-task.md names other fields for {wrong}"
