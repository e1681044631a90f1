"""``sc-train``: train on your own model, data and reward from a config file, and
``sc-export``: a checkpoint as a Hugging Face folder.

    sc-train --config run.yaml                         # train (continues a run it finds)
    sc-train --config run.yaml trainer.total_epochs=3  # dotted overrides, verl's keys
    sc-train --config run.yaml --print-config          # the resolved config; nothing runs
    sc-train --help-keys                               # every key, its default and meaning
    sc-export OUTPUT_OR_CHECKPOINT HF_DIR              # the actor as a Hugging Face folder

A run writes its resolved configuration to ``<trainer.default_local_dir>/config.yaml``;
``sc-train --config <that file>`` runs the same configuration again.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

import yaml

from .._errors import ScTrainerError
from ..config import (
    KEYS,
    TRAIN_DEFAULTS,
    TrainerConfig,
    config_from_document,
    load_document,
    parse_overrides,
    resolved_document,
)
from ..config._keys import DERIVED
from ..launch import TaskRunner
from ..runs import export_checkpoint
from ._errors import user_errors

__all__ = ["export_main", "train_main", "train_parser"]


def train_parser() -> argparse.ArgumentParser:
    """The ``sc-train`` command line."""
    parser = argparse.ArgumentParser(
        prog="sc-train",
        description=(
            "Train a Hugging Face model on your own data and reward by PPO or GRPO. The config "
            "file and the KEY=VALUE overrides use verl's keys (data.train_files, "
            "actor_rollout_ref.model.path, custom_reward_function.path, "
            "algorithm.adv_estimator, trainer.logger, ...); --help-keys lists them all."
        ),
    )
    parser.add_argument("--config", metavar="FILE", help="a YAML config file")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved configuration as YAML and exit without running",
    )
    parser.add_argument(
        "--help-keys", action="store_true", help="list every key with its default and exit"
    )
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="INFO logs the data's statistics and every step's metrics (default: WARNING)",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="KEY=VALUE", help="a key of the config, set"
    )
    return parser


def config_from_args(args: argparse.Namespace) -> TrainerConfig:
    """The configuration the parsed ``sc-train`` command line asks for."""
    document: dict[str, Any] = {} if args.config is None else load_document(args.config)
    document.update(parse_overrides(args.overrides))
    return config_from_document(document, TRAIN_DEFAULTS)


def _keys_table() -> str:
    defaults = resolved_document(config_from_document({}, TRAIN_DEFAULTS))
    lines = []
    for key in KEYS:
        value: Any = defaults
        for part in key.name.split("."):
            value = value[part]
        derived = " (derived)" if key.name in DERIVED else ""
        lines.append(f"{key.name} = {value!r}{derived}\n    {key.help}")
    return "\n".join(lines) + "\n"


def train_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sc-train``; returns the exit status (2: a bad configuration)."""
    parser = train_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(name)s %(message)s")
    if args.help_keys:
        sys.stdout.write(_keys_table())
        return 0
    try:
        config = config_from_args(args)
    except ScTrainerError as err:
        parser.error(str(err))
    if args.print_config:
        sys.stdout.write(yaml.safe_dump(resolved_document(config), sort_keys=False))
        return 0
    started = time.perf_counter()
    try:
        result = TaskRunner(config).run()
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        sys.stderr.write(f"sc-train: error: {err}\n")
        return 1
    sys.stdout.write(
        f"sc-train: {result.final_step} steps in {time.perf_counter() - started:.0f} s; "
        f"validation reward {result.first_val_reward:.3f} before -> "
        f"{result.last_val_reward:.3f} after\n"
        f"  output folder: {result.output.root.resolve()}\n"
        f"  checkpoint:    {result.checkpoint}\n"
    )
    return 0


def export_main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``sc-export``: the actor of a checkpoint as a Hugging Face folder."""
    parser = argparse.ArgumentParser(
        prog="sc-export",
        description=(
            "Write the actor of a checkpoint as a Hugging Face folder that "
            "AutoModelForCausalLM.from_pretrained loads. CHECKPOINT is a checkpoint folder "
            "(checkpoints/global_step_N), or a run's output folder (its newest checkpoint)."
        ),
    )
    parser.add_argument("checkpoint", metavar="CHECKPOINT")
    parser.add_argument("out", metavar="HF_DIR")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING", format="%(asctime)s %(name)s %(message)s")
    try:
        out = export_checkpoint(args.checkpoint, args.out)
    except Exception as err:
        if not isinstance(err, user_errors()):
            raise
        sys.stderr.write(f"sc-export: error: {err}\n")
        return 1
    sys.stdout.write(f"sc-export: wrote {out.resolve()}\n")
    return 0
