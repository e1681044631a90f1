"""The tiny GPT-2 the built-in rollout engine's tests serve: 2 layers of width 64, heads of
32, tied embeddings, 64 positions, and a word-level tokenizer over ``WORDS`` (16 ids; pad 0,
eos 1), saved as a user's checkpoint is. transformers is imported when it is built (the
tests skip, or fail in the nox session, before that when it is missing)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

WORDS = ["<pad>", "<eos>", *"abcdefghijklmn"]  # 16 ids
VOCAB = len(WORDS)


def build_tiny_gpt2(root: Path) -> str:
    """Write the model and its tokenizer to ``root / "tiny-gpt2"``; returns that path."""
    transformers: Any = importlib.import_module("transformers")
    tokenizers: Any = importlib.import_module("tokenizers")
    torch.manual_seed(11)
    config = transformers.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=64,
        n_layer=2,
        n_head=2,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    path = root / "tiny-gpt2"
    model.save_pretrained(str(path))
    vocab = {word: i for i, word in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>"
    )
    fast.save_pretrained(str(path))
    return str(path)
