"""Which task a configuration asks for, and the model an engine server trains when none is
given."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import TypeAlias

from sc_workers import load_hf_tokenizer

from .._errors import TrainerConfigError
from ..agents import AgentEnvironment
from ..config import TrainerConfig
from ._dataset import DatasetTask
from ._digits import DigitsTask
from ._text_digits import TextDigitsTask
from ._tiny_gpt2 import save_tiny_gpt2
from ._tool_calc import TOOL_CALC_CHARS, ToolCalcTask

__all__ = ["Task", "make_task", "with_server_model"]

logger = logging.getLogger(__name__)

#: what a run trains on: the user's dataset, a built-in digit task, or an agent task
Task: TypeAlias = "DigitsTask | DatasetTask | AgentEnvironment"


def with_server_model(config: TrainerConfig) -> TrainerConfig:
    """``config``, with a model an engine server can load when it generates on servers
    (``rollout_engine`` builtin or vllm) and names none: a tiny GPT-2 written to
    ``<output_dir>/model`` (once; a resumed run finds it there)."""
    if config.rollout_engine == "workers" or config.model_path is not None:
        return config
    folder = Path(config.output_dir) / "model"
    if not (folder / "config.json").is_file():
        folder.parent.mkdir(parents=True, exist_ok=True)
        chars = TOOL_CALC_CHARS if config.task.mode == "tool-calc" else None
        save_tiny_gpt2(folder, seed=config.seed, chars=chars)
        logger.info("wrote a tiny GPT-2 for the %s rollout to %s", config.rollout_engine, folder)
    return dataclasses.replace(config, model_path=str(folder.resolve()))


def make_task(config: TrainerConfig) -> Task:
    """The task of a run: the user's dataset and reward function (``config.data``), read
    through the tokenizer of the Hugging Face model at ``config.model_path``; else a built-in
    task: token by token for the built-in model, as text through that tokenizer; the tool
    task (on engine servers, so always a Hugging Face model) through that tokenizer too."""
    if config.data.given:
        if config.model_path is None:
            raise TrainerConfigError("make_task: a dataset needs a Hugging Face model (model_path)")
        return DatasetTask(config, load_hf_tokenizer(config.model_path))
    if config.task.mode == "tool-calc":
        if config.model_path is None:
            raise TrainerConfigError(
                "make_task: the tool task needs a Hugging Face model (model_path); "
                "with_server_model writes one"
            )
        return ToolCalcTask(load_hf_tokenizer(config.model_path))
    if config.model_path is None:
        return DigitsTask(config.task)
    return TextDigitsTask(config.task, load_hf_tokenizer(config.model_path))
