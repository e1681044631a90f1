"""Models: the built-in causal transformer and the optional Hugging Face adapter."""

from ._hf import HFCausalLM, load_hf_model
from ._transformer import KVCache, TinyCausalLM

__all__ = ["HFCausalLM", "KVCache", "TinyCausalLM", "load_hf_model"]
