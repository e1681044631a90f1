"""One prompt to text and token ids, through a Hugging Face tokenizer (duck-typed).

A prompt is a plain string or a list of chat messages (``[{"role": ..., "content": ...}]``).

* Chat messages are rendered with the tokenizer's chat template,
  ``apply_chat_template(messages, add_generation_prompt=True, tokenize=False)``, and that
  text is encoded with ``encode(text, add_special_tokens=False)``: the template writes every
  special token the model expects (its bos included, if it has one), and nothing is added
  twice. The rendered text is the ``prompt_text`` of the row, so the text and the token ids
  always agree.
* A string is encoded as it is, ``encode(text, add_special_tokens=False)``, then the
  tokenizer's bos token is put first when the tokenizer has one and the text does not
  already start with it: the prompt starts with bos exactly once, whatever the tokenizer's
  own ``add_special_tokens`` would have added (some also add eos, which a prompt must not
  end with).

Keys of a message whose value is ``None`` are dropped before the template sees it: parquet
gives every message of a column the same fields, ``None`` where a message had none, and
templates test ``message.tool_calls is defined``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from .._errors import DatasetError
from ._files import short

__all__ = ["Rendered", "render_prompt"]

#: the prompt's text as given to the tokenizer and its token ids
Rendered = tuple[str, list[int]]


def render_prompt(prompt: object, tokenizer: Any, where: str) -> Rendered:
    """The text and token ids of ``prompt`` (``where`` names the row in error messages)."""
    if isinstance(prompt, np.ndarray):
        prompt = prompt.tolist()
    if isinstance(prompt, str):
        ids = _encode(prompt, tokenizer, where)
        bos = getattr(tokenizer, "bos_token_id", None)
        if isinstance(bos, int) and ids[0] != bos:
            ids.insert(0, bos)
        return prompt, ids
    if isinstance(prompt, (list, tuple)):
        messages = _messages(prompt, where)
        text = _apply_template(messages, tokenizer, where)
        return text, _encode(text, tokenizer, where)
    raise DatasetError(
        f"{where}: the prompt must be a string or a list of chat messages "
        f"({{'role': ..., 'content': ...}}), got {type(prompt).__name__} {short(prompt)}"
    )


def _messages(prompt: list[Any] | tuple[Any, ...], where: str) -> list[dict[str, Any]]:
    if not prompt:
        raise DatasetError(f"{where}: the prompt is an empty list of chat messages")
    messages: list[dict[str, Any]] = []
    for k, message in enumerate(prompt):
        if not isinstance(message, Mapping):
            raise DatasetError(
                f"{where}: message {k} of the prompt is not a dict with 'role' and "
                f"'content': {short(message)}"
            )
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise DatasetError(
                f"{where}: message {k} of the prompt needs a string 'role' and a string "
                f"'content', got {short(dict(message))}"
            )
        messages.append({key: value for key, value in message.items() if value is not None})
    return messages


def _apply_template(messages: list[dict[str, Any]], tokenizer: Any, where: str) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise DatasetError(
            f"{where}: the prompt is a list of chat messages but the tokenizer has no chat "
            f"template (tokenizer.chat_template is unset); give a tokenizer with one, or "
            f"string prompts: {short(messages)}"
        )
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    except Exception as exc:  # a template may raise anything (jinja2 errors, ValueError, ...)
        raise DatasetError(
            f"{where}: the tokenizer's chat template cannot render the prompt ({exc!r}): "
            f"{short(messages)}"
        ) from exc
    if not isinstance(text, str):
        raise DatasetError(
            f"{where}: the chat template rendered {type(text).__name__}, not a string: "
            f"{short(text)}"
        )
    return text


def _encode(text: str, tokenizer: Any, where: str) -> list[int]:
    try:
        raw = tokenizer.encode(text, add_special_tokens=False)
        ids = [int(i) for i in raw]
    except Exception as exc:  # whatever the tokenizer raises for this text
        raise DatasetError(
            f"{where}: the prompt cannot be tokenized ({exc!r}): {short(text)}"
        ) from exc
    if not ids:
        raise DatasetError(f"{where}: the prompt is empty after tokenizing: {short(text)}")
    return ids
