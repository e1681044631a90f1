"""The model section: the built-in causal transformer or a local Hugging Face model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from .._errors import ConfigError
from ._base import DTYPES, ConfigBase, one_of, positive

__all__ = ["ModelConfig"]


@dataclass
class ModelConfig(ConfigBase):
    """The model: the built-in causal transformer, or a local Hugging Face model (``path``).

    The built-in model is initialised from ``seed`` identically on every rank, so an actor
    and its reference model start from the same weights. ``path`` needs ``sc-workers[hf]``
    and a directory on local disk (nothing is downloaded); the architecture then comes from
    that directory's ``config.json``, and the architecture fields here are informational
    (:func:`~sc_workers.hf_model_config` fills them, and the token ids, from the directory).
    With ``path`` the seed initialises what the checkpoint does not hold (a critic's value
    head), identically on every rank. ``eos_token_id`` is one id or a tuple of ids (any of
    them ends a response).

    ``absolute_position_embeddings`` adds a learned embedding of each token's position
    (``position_ids``, below ``max_position_embeddings``) to its token embedding, on top of
    the rotary embeddings: rotary attention sees only relative distances, and a task whose
    answer depends on absolute positions (reversing a string: answer token ``i`` copies
    prompt token ``L - i``) is much harder to learn from scratch without it. Built-in model
    only.
    """

    _section: ClassVar[str] = "model"

    path: str | None = None
    vocab_size: int = 32
    hidden_size: int = 32
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    intermediate_size: int = 64
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    pad_token_id: int = 0
    eos_token_id: int | tuple[int, ...] = 1
    seed: int = 0
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    absolute_position_embeddings: bool = False

    def __post_init__(self) -> None:
        o = self._section
        positive(
            o,
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            max_position_embeddings=self.max_position_embeddings,
            rope_theta=self.rope_theta,
            rms_norm_eps=self.rms_norm_eps,
        )
        # the built-in model's shape rules; a Hugging Face model brings its own architecture
        if self.path is None and self.hidden_size % self.num_attention_heads:
            raise ConfigError(
                f"{o}.hidden_size {self.hidden_size} is not divisible by "
                f"num_attention_heads {self.num_attention_heads}"
            )
        if self.path is None and (self.hidden_size // self.num_attention_heads) % 2:
            raise ConfigError(
                f"{o}: head dim {self.hidden_size // self.num_attention_heads} "
                f"(hidden_size {self.hidden_size} / num_attention_heads "
                f"{self.num_attention_heads}) must be even for rotary embeddings"
            )
        if not isinstance(self.absolute_position_embeddings, bool):
            raise ConfigError(
                f"{o}.absolute_position_embeddings must be a bool, "
                f"got {self.absolute_position_embeddings!r}"
            )
        if self.path is not None and self.absolute_position_embeddings:
            raise ConfigError(
                f"{o}.absolute_position_embeddings is an option of the built-in model; the "
                f"Hugging Face model at path={self.path!r} brings its own position encoding"
            )
        given: object = self.eos_token_id
        if isinstance(given, list):  # a list from code rather than through from_dict
            self.eos_token_id = tuple(given)
        if self.eos_token_id == ():
            raise ConfigError(f"{o}.eos_token_id must name at least one token, got ()")
        ids: list[tuple[str, object]] = [("pad_token_id", self.pad_token_id)]
        ids += [("eos_token_id", v) for v in self.eos_token_ids]
        for name, value in ids:
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{o}.{name} must be an int, got {value!r}")
            if not 0 <= value < self.vocab_size:
                raise ConfigError(
                    f"{o}.{name} {value} is outside [0, vocab_size {self.vocab_size})"
                )
        one_of(o, "dtype", self.dtype, DTYPES)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        """``eos_token_id`` as a tuple."""
        eos = self.eos_token_id
        return eos if isinstance(eos, tuple) else (eos,)
