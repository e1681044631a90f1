"""Pipeline stages: a model split by decoder layers.

:func:`split_layers` decides which layers each stage runs; :class:`ModelStage` is what a
pipelined engine runs, and :class:`TinyStage` one stage of the built-in transformer, built
from a whole :class:`~sc_workers.TinyCausalLM` by keeping the parts it runs (Hugging Face
decoders: :class:`~sc_workers.models.HFStage`). The first stage keeps the embeddings, the
last the final norm and the output head, and every stage keeps its layers under their
original indices, so a stage's parameter names are the whole model's
(``layers.3.mlp.up_proj.weight`` on whichever stage runs layer 3): checkpoints and weight
sync address parameters the same way at every pipeline layout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import Tensor, nn

from .._errors import ConfigError
from ._transformer import (
    KVCache,
    RotaryEmbedding,
    TinyCausalLM,
    attention_allowed,
    checked_positions,
)

__all__ = ["ModelStage", "StageHead", "TinyStage", "graft", "split_layers"]

#: what the last stage applies to its logits (values) instead of returning them whole
StageHead = Callable[[Tensor], Any]


def split_layers(num_layers: int, num_stages: int) -> list[range]:
    """The decoder layers of each of ``num_stages`` stages, in order.

    Every stage gets ``num_layers // num_stages`` consecutive layers, and the first
    ``num_layers % num_stages`` stages one more: the last stage also runs the output head
    (a vocabulary-sized product and the loss), so the earlier stages take the extra layers.
    10 layers over 4 stages: 3, 3, 2, 2. Each stage needs at least one layer.
    """
    if num_stages < 1:
        raise ConfigError(f"split_layers: the number of stages must be >= 1, got {num_stages}")
    if num_layers < num_stages:
        raise ConfigError(
            f"split_layers: {num_layers} decoder layers cannot fill {num_stages} pipeline stages "
            "(pipeline_model_parallel_size x virtual_pipeline_model_parallel_size); each stage "
            "needs at least one layer"
        )
    base, extra = divmod(num_layers, num_stages)
    ranges: list[range] = []
    start = 0
    for stage in range(num_stages):
        count = base + (1 if stage < extra else 0)
        ranges.append(range(start, start + count))
        start += count
    return ranges


def graft(root: nn.Module, path: str, module: nn.Module) -> None:
    """Register ``module`` at the dotted ``path`` under ``root`` (``model.layers.3``),
    creating an empty :class:`~torch.nn.Module` for each missing name on the way.

    A path that already holds another module raises :class:`ConfigError` (the same module
    again is a no-op): two stages must not claim one name for different modules.
    """
    *scopes, leaf = path.split(".")
    node = root
    for name in scopes:
        child = dict(node.named_children()).get(name)
        if child is None:
            child = nn.Module()
            node.add_module(name, child)
        node = child
    existing = dict(node.named_children()).get(leaf)
    if existing is not None and existing is not module:
        raise ConfigError(
            f"graft: {path} already holds a {type(existing).__name__}, not this "
            f"{type(module).__name__}"
        )
    node.add_module(leaf, module)


class ModelStage(nn.Module):
    """One pipeline stage: ``forward(x, attention_mask, position_ids, head=None)``.

    On the first stage ``x`` is the token ids, elsewhere the previous stage's hidden
    states. A stage that is not the last returns ``(hidden, attention_mask,
    position_ids)``, so the next stage receives the masks with the activations and needs
    no batch of its own. The last stage returns logits ``[b, s, vocab]`` (values ``[b,
    s]`` with a value head), or ``head(logits)`` when a head is given (log-probabilities of
    the response tokens, say, so that whole logits never leave the stage).

    Subclasses share the whole model's modules and say which through :meth:`parts`, by
    their names in the whole model; :meth:`blocks` are the decoder layers it runs (each an
    FSDP unit, and what tensor parallelism splits).
    """

    def __init__(self, first: bool, last: bool) -> None:
        super().__init__()
        self.is_first = first
        self.is_last = last

    def parts(self) -> dict[str, nn.Module]:
        """The whole model's modules this stage runs, by their dotted names in it."""
        raise NotImplementedError(f"{type(self).__name__} does not list its parts")

    def blocks(self) -> list[nn.Module]:
        """The decoder layers this stage runs, in order."""
        raise NotImplementedError(f"{type(self).__name__} does not list its blocks")


class TinyStage(ModelStage):
    """One pipeline stage of a :class:`~sc_workers.TinyCausalLM` (it shares the modules);
    the calling convention is :class:`ModelStage`'s. Each stage computes its own rotary
    tables (no parameters). With a :class:`~sc_workers.models.KVCache` (sized for the whole
    model; the stage fills its layers' entries) ``x`` holds only new tokens and
    ``attention_mask`` covers the cached ones too, as in ``TinyCausalLM``."""

    def __init__(self, model: TinyCausalLM, layers: range, first: bool, last: bool) -> None:
        super().__init__(first, last)
        config = model.config
        self.config = config
        self.value_head = model.value_head
        self.embed_tokens = model.embed_tokens if first else None
        self.embed_positions = model.embed_positions if first else None
        self.layers = nn.ModuleDict({str(i): model.layers[i] for i in layers})
        self.norm = model.norm if last else None
        self.lm_head = model.lm_head if last else None
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def parts(self) -> dict[str, nn.Module]:
        parts: dict[str, nn.Module] = {}
        for name in ("embed_tokens", "embed_positions"):
            module = getattr(self, name)
            if module is not None:
                parts[name] = module
        parts.update({f"layers.{i}": layer for i, layer in self.layers.items()})
        if self.norm is not None and self.lm_head is not None:
            parts.update(norm=self.norm, lm_head=self.lm_head)
        return parts

    def blocks(self) -> list[nn.Module]:
        return list(self.layers.values())

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        head: StageHead | None = None,
        cache: KVCache | None = None,
    ) -> Any:
        # this stage's own layers say what is cached (another stage on the same rank may
        # already have run this step)
        past = 0 if cache is None else cache.length_of(int(next(iter(self.layers))))
        allowed = attention_allowed(attention_mask, past)
        cos, sin = self.rotary(position_ids)
        if self.embed_tokens is not None:
            x = self.embed_tokens(x)
            if self.embed_positions is not None:
                x = x + self.embed_positions(checked_positions(position_ids, self.config))
        for index, layer in self.layers.items():
            x = layer(x, cos, sin, allowed, cache, int(index))
        if self.lm_head is None or self.norm is None:
            return x, attention_mask, position_ids
        out: Tensor = self.lm_head(self.norm(x))
        if self.value_head:
            out = out.squeeze(-1)
        return out if head is None else head(out)
