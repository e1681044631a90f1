"""Models: the built-in causal transformer and the optional Hugging Face adapters."""

from sc_dispatch import _public

from ._hf import (
    HFCache,
    HFCausalLM,
    HFModelKind,
    HFValueModel,
    check_hf_tensor_parallel,
    load_hf_model,
    load_hf_tokenizer,
    save_hf_model,
)
from ._hf_stage import HFStage, HFStageSplit
from ._stage import ModelStage, TinyStage, split_layers
from ._transformer import KVCache, TinyCausalLM
from ._window import rows_forward, window_forward, window_row

__all__ = [
    "HFCache",
    "HFCausalLM",
    "HFModelKind",
    "HFStage",
    "HFStageSplit",
    "HFValueModel",
    "KVCache",
    "ModelStage",
    "TinyCausalLM",
    "TinyStage",
    "check_hf_tensor_parallel",
    "load_hf_model",
    "load_hf_tokenizer",
    "rows_forward",
    "save_hf_model",
    "split_layers",
    "window_forward",
    "window_row",
]

_public.publish(globals())
