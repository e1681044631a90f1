"""The ``sc-demo`` command line, run in-process on the local backend (no Ray)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sc_trainer import TrainerConfig, TrainerConfigError
from sc_trainer.cli import build_parser, config_from_args
from sc_trainer.cli import demo_main as main
from sc_trainer.runs import read_metrics

pytestmark = pytest.mark.timeout(300)

TINY = [
    "--backend",
    "local",
    "--workers-per-role",
    "1",
    "--prompts-per-step",
    "8",
    "--responses-per-prompt",
    "2",
    "--task-length",
    "3",
    "--val-every",
    "2",
    "--save-every",
    "2",
    "--no-progress",
]


def test_help_lists_every_option(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    options = [
        "--algorithm",
        "{ppo,grpo}",
        "--steps",
        "--workers-per-role",
        "--n-workers",
        "--colocate",
        "--no-colocate",
        "--backend",
        "{ray,local}",
        "--output-dir",
        "--resume-from",
        "--seed",
    ]
    for option in options:
        assert option in text, option


def test_arguments_become_the_config() -> None:
    args = build_parser().parse_args(
        [
            "--algorithm",
            "grpo",
            "--steps",
            "7",
            "--n-workers",
            "1",
            "--no-colocate",
            "--backend",
            "local",
            "--output-dir",
            "x",
            "--resume-from",
            "y",
            "--seed",
            "3",
            "--task",
            "copy",
        ]
    )
    cfg = config_from_args(args)
    assert (cfg.algorithm, cfg.steps, cfg.workers_per_role, cfg.colocate) == ("grpo", 7, 1, False)
    assert (cfg.backend, cfg.output_dir, cfg.resume_from, cfg.seed) == ("local", "x", "y", 3)
    assert cfg.task.mode == "copy"
    assert config_from_args(build_parser().parse_args([])) == TrainerConfig()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "0"], "steps must be > 0, got 0"),
        (["--backend", "local", "--n-workers", "2"], "workers_per_role=2"),
        (["--algorithm", "grpo", "--responses-per-prompt", "1"], "got 1"),
        (["--prompts-per-step", "3", "--responses-per-prompt", "1"], "= 3"),
        (["--no-colocate", "--num-cpus", "3"], "num_cpus (3) is below the 4 worker processes"),
    ],
)
def test_invalid_options_exit_with_the_reason(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_config_errors_name_the_value() -> None:
    with pytest.raises(TrainerConfigError, match="num_heads \\(3\\) must divide hidden_size"):
        TrainerConfig(num_heads=3)
    with pytest.raises(TrainerConfigError, match="'sgd'"):
        TrainerConfig(algorithm="sgd")  # type: ignore[arg-type]
    with pytest.raises(TrainerConfigError, match="gamma must be in \\[0, 1\\], got 2"):
        TrainerConfig(gamma=2)


def test_local_run_writes_the_output_folder_and_resumes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    assert main([*TINY, "--steps", "2", "--output-dir", str(out)]) == 0
    printed = capsys.readouterr().out
    assert str(out.resolve()) in printed
    assert "validation reward" in printed
    records = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in records] == [0, 1, 2]
    assert (out / "metrics.png").read_bytes()[:4] == b"\x89PNG"
    trace = json.loads((out / "trace.json").read_text())
    methods = " ".join({e["args"]["method"] for e in trace["traceEvents"]})
    for stage in ("generate_sequences", "compute_values", "update_actor", "update_critic"):
        assert stage in methods
    assert (out / "checkpoints" / "global_step_2" / "trainer_state.json").is_file()

    assert main([*TINY, "--steps", "4", "--output-dir", str(out), "--resume-from", str(out)]) == 0
    resumed = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in resumed] == [0, 1, 2, 3, 4]
    assert resumed[:3] == records
    assert (out / "checkpoints" / "latest").read_text().strip() == "4"


def test_resume_from_nothing_is_an_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*TINY, "--output-dir", str(tmp_path / "b"), "--resume-from", str(tmp_path)])
    assert code == 1
    assert "neither a checkpoint folder" in capsys.readouterr().err


def test_vllm_without_its_environment_fails_before_any_worker_naming_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SC_ROLLOUT_VLLM_ENV", str(tmp_path / "no-env"))
    out = tmp_path / "run"
    assert main(["--rollout", "vllm", "--no-progress", "--output-dir", str(out)]) == 1
    err = capsys.readouterr().err
    assert "sc-demo: error:" in err
    assert "python -m sc_rollout vllm-env create" in err
    assert not (out / "checkpoints").exists(), "nothing trained"


def test_importing_sc_demo_does_not_import_ray() -> None:
    """Ray reads RAY_ENABLE_UV_RUN_RUNTIME_ENV once, when first imported; the launcher sets
    it before importing Ray, so sc-demo's own module must not import Ray first (else every
    Ray worker would start through ``uv run`` in a copy of the working directory)."""
    code = "import sys, sc_trainer.cli; print('ray' in sys.modules)"
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert proc.stdout.strip() == "False"
