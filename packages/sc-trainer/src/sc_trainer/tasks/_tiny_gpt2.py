"""A tiny GPT-2 model directory for the digit task, built locally (nothing is downloaded):
what ``sc-demo --rollout vllm`` trains when no ``--model`` is given.

GPT-2 because vLLM serves it and its learned absolute positions let a two-layer model learn
the reversal (rotary-only models plateau on it, as the trainer guide measured); heads of
width 32 because vLLM's CPU attention takes no narrower ones. The tokenizer has one token
per character of the task: pad 0, eos 1, bos 2, then the digits and ``=``.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import torch

__all__ = ["TINY_GPT2_CHARS", "build_char_tokenizer", "save_tiny_gpt2"]

_SPECIAL = ["<pad>", "<eos>", "<bos>"]
#: the characters of the digit task, one token each after the special tokens
TINY_GPT2_CHARS = list("0123456789=")


def build_char_tokenizer(chars: list[str] | None = None) -> Any:
    """A transformers fast tokenizer with one token per character of the task (``chars``:
    another task's characters)."""
    transformers: Any = importlib.import_module("transformers")
    tokenizers: Any = importlib.import_module("tokenizers")
    vocab = {tok: i for i, tok in enumerate([*_SPECIAL, *(chars or TINY_GPT2_CHARS)])}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Split(tokenizers.Regex("."), behavior="isolated")
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>"
    )


def save_tiny_gpt2(
    path: str | Path,
    *,
    seed: int = 0,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    context: int = 32,
    chars: list[str] | None = None,
) -> str:
    """Write a freshly initialised GPT-2 (``hidden_size`` wide, ``num_heads`` heads) and its
    tokenizer (one token per character of ``chars``, the digit task's by default) to
    ``path`` with ``save_pretrained``; returns the path as a string."""
    transformers: Any = importlib.import_module("transformers")
    chars = chars or TINY_GPT2_CHARS
    tokenizer = build_char_tokenizer(chars)
    config = transformers.GPT2Config(
        vocab_size=len(_SPECIAL) + len(chars),
        n_positions=context,
        n_embd=hidden_size,
        n_layer=num_layers,
        n_head=num_heads,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
        # no dropout: the PPO ratio compares the policy that sampled (an engine, which never
        # drops) with the one that trains
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
    )
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
    return str(path)
