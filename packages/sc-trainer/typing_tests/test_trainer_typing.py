"""The trainer's worker calls are checked by mypy with ``sc_core.mypy_plugin``.

The ``sc_trainer`` sources are copied to a temporary folder; each case changes one worker
call of the trainer (a wrong argument type, a misspelt method, a result used as the wrong
type) and runs mypy with sc-trainer's configuration (``packages/sc-trainer/pyproject.toml``:
``--strict`` and the plugin) on the copy, which must then report that line, with that error
code, and nothing else. The unchanged copy must pass.

Run by the sc-trainer typecheck session (``pytest packages/sc-trainer/typing_tests``), next
to ``mypy --strict --config-file packages/sc-trainer/pyproject.toml`` on its sources and
tests.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DIST = Path(__file__).resolve().parents[1]
PACKAGE = DIST / "src" / "sc_trainer"
CONFIG = DIST / "pyproject.toml"
#: where the worker calls are looked for: every module of the package
TRAINER_GLOB = "**/*.py"

_MYPY_LINE = re.compile(r"^(?P<file>[^:]+\.py):(?P<line>\d+): error: .*\[(?P<code>[\w-]+)\]$")

#: (case id, the call as the trainer writes it, the same call made wrong, mypy's error code)
CASES = [
    (
        "argument-of-the-wrong-type",
        "batch.union(self.actor_rollout_wg.compute_log_prob(batch))",
        "batch.union(self.actor_rollout_wg.compute_log_prob(m))",
        "arg-type",
    ),
    (
        "critic-call-with-a-string",
        "self.critic_wg.compute_values(batch)",
        'self.critic_wg.compute_values("batch")',
        "arg-type",
    ),
    (
        "misspelt-method",
        "self.actor_rollout_wg.update_actor(batch)",
        "self.actor_rollout_wg.update_actr(batch)",
        "attr-defined",
    ),
    (
        "keyword-argument-of-the-wrong-type",
        'str(folder / "actor"), global_step=step, background=background',
        'str(folder / "actor"), global_step=step, background="yes"',
        "arg-type",
    ),
    (
        "one-to-all-result-used-as-a-batch",  # ONE_TO_ALL collects list[None], not a DataProto
        "metrics_of(self.critic_wg.update_critic(batch))",
        'metrics_of(self.critic_wg.save_checkpoint("ckpt"))',
        "arg-type",
    ),
]


@pytest.fixture(scope="module")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache for every run: after the first, mypy re-checks only the changed module."""
    return tmp_path_factory.mktemp("mypy-cache")


def _copy_package(root: Path) -> Path:
    target = root / "sc_trainer"
    shutil.copytree(PACKAGE, target, ignore=shutil.ignore_patterns("__pycache__"))
    return target


def _mypy(package: Path, cache: Path) -> list[tuple[str, int, str]]:
    """mypy's errors on the copied package: ``(file name, line, code)``."""
    env = dict(os.environ, NO_COLOR="1")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(CONFIG),
            "--cache-dir",
            str(cache),
            "--no-pretty",
            str(package),
        ],
        cwd=package.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = proc.stdout + proc.stderr
    if "INTERNAL ERROR" in out or "Traceback" in out:
        pytest.fail(f"mypy crashed:\n{out}")
    errors = []
    for line in out.splitlines():
        match = _MYPY_LINE.match(line)
        if match:
            errors.append((Path(match["file"]).name, int(match["line"]), match["code"]))
    if proc.returncode not in (0, 1) or (proc.returncode == 1 and not errors):
        pytest.fail(f"could not read mypy's output (exit {proc.returncode}):\n{out}")
    return errors


def test_the_trainer_passes_mypy_with_the_plugin(tmp_path: Path, mypy_cache: Path) -> None:
    package = _copy_package(tmp_path)
    assert _mypy(package, mypy_cache) == []


@pytest.mark.parametrize(
    ("original", "broken", "code"),
    [pytest.param(o, b, c, id=i) for i, o, b, c in CASES],
)
def test_a_wrong_worker_call_is_a_type_error_at_its_line(
    tmp_path: Path, mypy_cache: Path, original: str, broken: str, code: str
) -> None:
    package = _copy_package(tmp_path)
    where = [
        (path, n)
        for path in sorted(package.glob(TRAINER_GLOB))
        for n, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if original in text
    ]
    assert len(where) == 1, f"{original!r} is at {where} of {TRAINER_GLOB}; update the case"
    ((path, line),) = where
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[line - 1] = lines[line - 1].replace(original, broken)
    path.write_text("".join(lines), encoding="utf-8")
    assert _mypy(package, mypy_cache) == [(path.name, line, code)]
