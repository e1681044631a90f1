"""What a run trains on: the user's dataset and reward function, or a built-in task.

:class:`DatasetTask` trains on the user's data (``data.train_files``) with their reward
function (``custom_reward_function``). The built-in tasks: :class:`DigitsTask` (answer a
string of digits reversed, scored per position) for the
built-in model, :class:`TextDigitsTask` (the same through a Hugging Face tokenizer),
:class:`ToolCalcTask` (an agent task: modular multiplication with a calculator tool);
:func:`make_task` picks the one a configuration asks for, :class:`TaskPrompts` makes a digit
task's batches for the rollout sources, and :func:`save_tiny_gpt2` writes the tiny GPT-2 an
engine server trains when no model is given (:func:`with_server_model`).
"""

from sc_dispatch import _public

from .._errors import TaskError
from .._scores import BatchScores
from ._dataset import DatasetTask, data_state
from ._digits import CharTokenizer, DigitsTask
from ._make import Task, make_task, with_server_model
from ._prompts import TaskPrompts
from ._text_digits import TextDigitsTask
from ._tiny_gpt2 import TINY_GPT2_CHARS, build_char_tokenizer, save_tiny_gpt2
from ._tool_calc import TOOL_CALC_CHARS, ToolCalcTask

__all__ = [
    "BatchScores",
    "CharTokenizer",
    "DatasetTask",
    "DigitsTask",
    "TINY_GPT2_CHARS",
    "TOOL_CALC_CHARS",
    "Task",
    "TaskError",
    "TaskPrompts",
    "TextDigitsTask",
    "ToolCalcTask",
    "build_char_tokenizer",
    "data_state",
    "make_task",
    "save_tiny_gpt2",
    "with_server_model",
]

_public.publish(globals())
