"""A small decoder-only transformer, built in so that nothing is downloaded.

Pre-norm blocks (RMSNorm), rotary position embeddings driven by ``position_ids`` (so left
padding works), optionally learned absolute position embeddings as well
(``ModelConfig.absolute_position_embeddings``), SiLU-gated MLP, and an optional key/value
cache for generation. Projection names follow the Llama convention (``q_proj`` ...
``down_proj``) so the tensor-parallel plan of the megatron engine can address them.
Attention reads the number of heads from the width of its (possibly tensor-parallel, hence
local) projections, so the same module works unsharded and under column/row-parallel
sharding. With a :class:`~._ulysses.SequenceParallel` (``sequence_parallel=``) the model runs
one shard of each sequence and attention gathers the full sequence for a slice of the heads
(Ulysses).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._config import ModelConfig
from .._errors import BatchError
from ._ulysses import SequenceParallel

__all__ = ["KVCache", "RotaryEmbedding", "TinyCausalLM", "attention_allowed", "checked_positions"]


class KVCache:
    """Keys and values of every layer for incremental decoding (one entry per layer)."""

    def __init__(self, num_layers: int) -> None:
        self.keys: list[Tensor | None] = [None] * num_layers
        self.values: list[Tensor | None] = [None] * num_layers

    def length_of(self, layer: int) -> int:
        """Tokens cached so far for ``layer``."""
        keys = self.keys[layer]
        return 0 if keys is None else int(keys.shape[2])

    @property
    def length(self) -> int:
        """Tokens cached so far (a pipeline stage fills only its own layers' entries)."""
        for keys in self.keys:
            if keys is not None:
                return int(keys.shape[2])
        return 0

    def update(self, layer: int, key: Tensor, value: Tensor) -> tuple[Tensor, Tensor]:
        old_k, old_v = self.keys[layer], self.values[layer]
        if old_k is not None and old_v is not None:
            key = torch.cat([old_k, key], dim=2)
            value = torch.cat([old_v, value], dim=2)
        self.keys[layer] = key
        self.values[layer] = value
        return key, value


def _rotate_half(x: Tensor) -> Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables computed on the fly from integer positions."""

    inv_freq: Tensor

    def __init__(self, head_dim: int, theta: float) -> None:
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
        self.register_buffer("inv_freq", (1.0 / theta**exponents).float(), persistent=False)

    def forward(self, position_ids: Tensor) -> tuple[Tensor, Tensor]:
        angles = position_ids.float()[..., None] * self.inv_freq.to(position_ids.device)
        angles = torch.cat([angles, angles], dim=-1)[:, None, :, :]  # [b, 1, s, d]
        return angles.cos(), angles.sin()


class Attention(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        h = config.hidden_size
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(h, h, bias=False)
        self.k_proj = nn.Linear(h, h, bias=False)
        self.v_proj = nn.Linear(h, h, bias=False)
        self.o_proj = nn.Linear(h, h, bias=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        allowed: Tensor,
        cache: KVCache | None,
        layer: int,
        sequence_parallel: SequenceParallel | None = None,
    ) -> Tensor:
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        q = q * cos.to(q.dtype) + _rotate_half(q) * sin.to(q.dtype)
        k = k * cos.to(k.dtype) + _rotate_half(k) * sin.to(k.dtype)
        if cache is not None:
            k, v = cache.update(layer, k, v)
        sp = sequence_parallel
        if sp is not None:  # [b, heads, s/sp, d] -> [b, heads/sp, s, d]
            q, k, v = sp.seq_to_heads(q), sp.seq_to_heads(k), sp.seq_to_heads(v)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        if sp is not None:
            out = sp.heads_to_seq(out)
        projected: Tensor = self.o_proj(out.transpose(1, 2).reshape(b, s, -1))
        return projected


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        out: Tensor = self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.input_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = MLP(config)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        allowed: Tensor,
        cache: KVCache | None,
        layer: int,
        sequence_parallel: SequenceParallel | None = None,
    ) -> Tensor:
        attn_in = self.input_layernorm(x)
        x = x + self.self_attn(attn_in, cos, sin, allowed, cache, layer, sequence_parallel)
        mlp_out: Tensor = self.mlp(self.post_attention_layernorm(x))
        return x + mlp_out


class TinyCausalLM(nn.Module):
    """The built-in causal language model; ``value_head=True`` makes it a critic.

    ``forward(input_ids, attention_mask, position_ids, cache=None)`` takes ``[batch, seq]``
    tensors and returns logits ``[batch, seq, vocab]`` (or values ``[batch, seq]`` with a
    value head). With a :class:`KVCache`, ``input_ids`` holds only the new tokens and
    ``attention_mask`` covers the cached tokens plus the new ones. With
    ``sequence_parallel``, ``input_ids`` and ``position_ids`` are this rank's shard of the
    sequence, ``attention_mask`` covers the whole sequence, and the outputs are the shard's.
    """

    supports_kv_cache = True

    def __init__(self, config: ModelConfig, value_head: bool = False) -> None:
        super().__init__()
        self.config = config
        self.value_head = value_head
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.embed_positions = (
            nn.Embedding(config.max_position_embeddings, config.hidden_size)
            if config.absolute_position_embeddings
            else None
        )
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = nn.RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)
        out_features = 1 if value_head else config.vocab_size
        self.lm_head = nn.Linear(config.hidden_size, out_features, bias=value_head)
        self.reset_parameters()
        if config.tie_word_embeddings and not value_head:
            self.lm_head.weight = self.embed_tokens.weight

    def new_cache(self) -> KVCache:
        """An empty key/value cache for one generation call."""
        return KVCache(len(self.layers))

    def reset_parameters(self) -> None:
        """Normal(0, 0.02) weights, unit norms, zero biases, and a zero value head (a new
        critic predicts 0 for every state, so its first advantages are the plain returns
        rather than noise); seed the RNG first for determinism."""
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, mean=0.0, std=0.02)
                if isinstance(module, nn.Linear) and module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.RMSNorm) and module.weight is not None:
                nn.init.ones_(module.weight)
        if self.value_head:
            nn.init.zeros_(self.lm_head.weight)

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: KVCache | None = None,
        sequence_parallel: SequenceParallel | None = None,
    ) -> Tensor:
        b, s = input_ids.shape
        past = 0 if cache is None else cache.length
        shards = 1 if sequence_parallel is None else sequence_parallel.size
        if sequence_parallel is not None and cache is not None:
            raise BatchError(
                "TinyCausalLM: a key/value cache is not combined with sequence_parallel"
            )
        total = past + s * shards  # attention sees every shard's tokens
        if attention_mask.shape != (b, total):
            raise BatchError(
                f"TinyCausalLM: attention_mask shape {tuple(attention_mask.shape)} does not "
                f"match batch {b} x (cached {past} + new {s} x sp shards {shards}) tokens"
            )
        allowed = attention_allowed(attention_mask, past)
        cos, sin = self.rotary(position_ids)
        x = self.embed(input_ids, position_ids)
        for i, layer in enumerate(self.layers):
            x = layer(x, cos, sin, allowed, cache, i, sequence_parallel)
        return self.head(x)

    def embed(self, input_ids: Tensor, position_ids: Tensor) -> Tensor:
        """Token (and absolute position) embeddings: the first layer's input."""
        x: Tensor = self.embed_tokens(input_ids)
        if self.embed_positions is not None:
            x = x + self.embed_positions(checked_positions(position_ids, self.config))
        return x

    def head(self, x: Tensor) -> Tensor:
        """Final norm and output head: logits ``[b, s, vocab]`` (values ``[b, s]``)."""
        out: Tensor = self.lm_head(self.norm(x))
        if self.value_head:
            return out.squeeze(-1).clone()  # not a view: FSDP hooks the root's output
        return out


def checked_positions(position_ids: Tensor, config: ModelConfig) -> Tensor:
    """``position_ids`` as indices of the absolute position table (padding may carry
    negative positions: they read row 0, and attention ignores them anyway)."""
    limit = config.max_position_embeddings
    highest = int(position_ids.max()) if position_ids.numel() else 0
    if highest >= limit:
        raise BatchError(
            f"TinyCausalLM: position {highest} is beyond the absolute position table "
            f"(max_position_embeddings {limit}); raise max_position_embeddings"
        )
    return position_ids.clamp(min=0)


def attention_allowed(attention_mask: Tensor, past: int = 0) -> Tensor:
    """``[b, 1, s, past + s]``: which keys each new query may attend to.

    Causal over the ``past + s`` keys of ``attention_mask`` (``[b, past + s]``), padding
    keys excluded; every query may see itself, so a fully padded row never softmaxes over
    nothing.
    """
    total = attention_mask.shape[1]
    device = attention_mask.device
    key_ok = attention_mask.bool()[:, None, None, :]  # [b, 1, 1, total]
    q_pos = torch.arange(past, total, device=device)[:, None]
    k_pos = torch.arange(total, device=device)[None, :]
    causal = k_pos <= q_pos  # [s, total]
    return (key_ok & causal) | (k_pos == q_pos)
