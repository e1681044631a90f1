"""A config file with verl's keys and dotted overrides (``sc-train``): every trainer setting is
reachable, the resolved config round-trips, an unknown key names the nearest known one, and
verl's keys counted in other units than sc's fields convert both ways."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_trainer import TrainerConfig
from sc_trainer.cli import train_main
from sc_trainer.config import (
    KEYS,
    TRAIN_DEFAULTS,
    TrainerConfigError,
    config_from_dict,
    config_from_document,
    load_document,
    parse_overrides,
    resolved_document,
    write_document,
)
from sc_trainer.config._keys import DERIVED

FILE = """
data:
  train_files: [a.parquet, b.parquet]
  val_files: v.jsonl
  max_prompt_length: 64
  train_batch_size: 16
actor_rollout_ref:
  model: {path: /models/tiny}
  actor:
    optim: {lr: 1e-5}
    ppo_mini_batch_size: 4
    use_kl_loss: true
    kl_loss_coef: 0.01
  rollout: {n: 8, temperature: 0.7}
algorithm.adv_estimator: grpo
custom_reward_function:
  path: my_reward.py
  name: score
trainer:
  logger: [console, tensorboard]
  total_epochs: 3
  total_training_steps: null
  n_gpus_per_node: 2
  save_freq: 10
"""


def _leaves(cls: type, prefix: str = "") -> set[str]:
    hints = typing.get_type_hints(cls)
    found: set[str] = set()
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if isinstance(kind, type) and dataclasses.is_dataclass(kind):
            found |= _leaves(kind, f"{prefix}{f.name}.")
        else:
            found.add(f"{prefix}{f.name}")
    return found


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_file_and_overrides_build_the_configuration(tmp_path: Path) -> None:
    document = load_document(_write(tmp_path, FILE))
    document.update(parse_overrides(["trainer.logger=[console]", "data.shuffle=false"]))
    config = config_from_document(document, TRAIN_DEFAULTS)
    assert config.data.train_files == ("a.parquet", "b.parquet")
    assert config.data.val_files == ("v.jsonl",)
    assert config.prompts_per_step == 16
    assert config.ppo_mini_batches == 4  # 16 prompts in mini-batches of 4
    assert config.actor_lr == 1e-5  # YAML reads 1e-5 as a string; the field is a float
    assert (config.kl_coef, config.responses_per_prompt, config.temperature) == (0.01, 8, 0.7)
    assert config.algorithm == "grpo"
    assert (config.reward.path, config.reward.name) == ("my_reward.py", "score")
    assert config.tracking.logger == ("console",)
    assert (config.steps, config.data.total_epochs) == (None, 3)
    assert config.workers_per_role == 2
    assert config.save_every == 10
    assert not config.data.shuffle
    assert config.resume_mode == "auto"  # sc-train's own default


def test_the_resolved_config_round_trips(tmp_path: Path) -> None:
    document = load_document(_write(tmp_path, FILE))
    config = config_from_document(document, TRAIN_DEFAULTS)
    written = write_document(config, tmp_path / "out" / "config.yaml")
    again = config_from_document(load_document(written))
    assert again == config
    assert config_from_dict(TrainerConfig, dataclasses.asdict(config)) == config


@settings(max_examples=40, deadline=None)
@given(
    prompts=st.sampled_from([8, 16, 32]),
    mini=st.sampled_from([1, 2, 4, 8]),
    kl=st.sampled_from([0.0, 0.001, 0.5]),
    nodes=st.sampled_from([1, 2]),
    per_node=st.sampled_from([1, 2]),
    algorithm=st.sampled_from(["ppo", "grpo"]),
)
def test_derived_keys_convert_both_ways(
    prompts: int, mini: int, kl: float, nodes: int, per_node: int, algorithm: str
) -> None:
    config = TrainerConfig(
        prompts_per_step=prompts,
        ppo_mini_batches=prompts // mini,
        kl_coef=kl,
        nnodes=nodes,
        workers_per_role=nodes * per_node,
        responses_per_prompt=8,  # rows enough for every split of workers and mini-batches
        algorithm=algorithm,  # type: ignore[arg-type]
    )
    document = resolved_document(config)
    actor = document["actor_rollout_ref"]["actor"]
    assert actor["ppo_mini_batch_size"] == mini
    assert actor["use_kl_loss"] == (kl > 0)
    assert document["trainer"]["n_gpus_per_node"] == per_node
    assert document["algorithm"]["adv_estimator"] == ("gae" if algorithm == "ppo" else "grpo")
    flat = _flatten(document)
    assert config_from_document(flat) == config


def _flatten(document: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def test_every_trainer_setting_is_reachable_from_a_key() -> None:
    reached = {key.field for key in KEYS if key.field}
    reached |= {field for fields in DERIVED.values() for field in fields}
    assert _leaves(TrainerConfig) - reached == set()
    names = [key.name for key in KEYS]
    assert len(names) == len(set(names))


def test_an_unknown_key_names_the_nearest_known_one(tmp_path: Path) -> None:
    with pytest.raises(
        TrainerConfigError, match=r"unknown key 'data\.train_file'.*'data\.train_files'"
    ):
        parse_overrides(["data.train_file=x.parquet"])
    with pytest.raises(
        TrainerConfigError, match=r"'trainer\.lr'.*'actor_rollout_ref\.actor\.optim\.lr'"
    ):
        parse_overrides(["trainer.lr=0.1"])
    bad_file = _write(tmp_path, "trainer:\n  totl_epochs: 2\n")
    with pytest.raises(TrainerConfigError, match=r"run\.yaml.*'trainer\.total_epochs'"):
        load_document(bad_file)
    with pytest.raises(TrainerConfigError, match="is verl's, and sc has no counterpart"):
        parse_overrides(["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"])


def test_bad_files_values_and_overrides_are_refused(tmp_path: Path) -> None:
    with pytest.raises(TrainerConfigError, match="does not exist"):
        load_document(tmp_path / "none.yaml")
    with pytest.raises(TrainerConfigError, match="not valid YAML"):
        load_document(_write(tmp_path, "data: [unclosed\n"))
    with pytest.raises(TrainerConfigError, match="must hold a mapping"):
        load_document(_write(tmp_path, "- a\n- b\n"))
    with pytest.raises(TrainerConfigError, match="must look like key=value"):
        parse_overrides(["data.shuffle"])
    with pytest.raises(TrainerConfigError, match=r"ppo_mini_batch_size=5 .* divides"):
        config_from_document({"actor_rollout_ref.actor.ppo_mini_batch_size": 5})
    with pytest.raises(TrainerConfigError, match="adv_estimator must be 'gae'"):
        config_from_document({"algorithm.adv_estimator": "rloo"})
    with pytest.raises(TrainerConfigError, match="always saves"):
        config_from_document({"actor_rollout_ref.actor.checkpoint.save_contents": ["model"]})
    with pytest.raises(TrainerConfigError, match="must be a number, got 'fast'"):
        config_from_document({"actor_rollout_ref.actor.optim.lr": "fast"})
    with pytest.raises(TrainerConfigError, match=r"use_kl_loss must be true or false"):
        config_from_document({"actor_rollout_ref.actor.use_kl_loss": "yes"})
    assert config_from_document({"actor_rollout_ref.actor.use_kl_loss": False}).kl_coef == 0.0


def test_the_command_prints_the_resolved_config_and_the_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _write(tmp_path, FILE)
    assert train_main(["--config", str(path), "--print-config", "trainer.save_freq=5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["trainer"]["save_freq"] == 5
    assert config_from_document(_flatten(printed)).save_every == 5
    assert train_main(["--help-keys"]) == 0
    listing = capsys.readouterr().out
    assert all(key.name in listing for key in KEYS)
    with pytest.raises(SystemExit) as exc:
        train_main(["--print-config", "data.train_file=x"])
    assert exc.value.code == 2
    assert "nearest known key is 'data.train_files'" in capsys.readouterr().err
