"""A tiny Hugging Face model directory for the digit task, built in code (no hub access).

A Qwen2 causal LM (2 layers, width 64, tied embeddings) and a character-level word tokenizer
over the task's characters, saved with ``save_pretrained`` as a user's checkpoint would be.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch
from sc_trainer.tasks import TINY_GPT2_CHARS, build_char_tokenizer

SPECIAL = ["<pad>", "<eos>", "<bos>"]
CHARS = TINY_GPT2_CHARS

#: one token per character of the task; pad 0, eos 1, bos 2 (the tiny GPT-2's tokenizer)
build_tokenizer = build_char_tokenizer


def save_tiny_qwen2(path: Path, seed: int = 0) -> str:
    """Write the model and its tokenizer to ``path``; returns it as a string."""
    transformers: Any = importlib.import_module("transformers")
    tokenizer = build_tokenizer()
    config = transformers.Qwen2Config(
        vocab_size=len(SPECIAL) + len(CHARS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)
