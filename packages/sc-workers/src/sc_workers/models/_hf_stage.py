"""Pipeline stages of Hugging Face decoders (extra ``sc-workers[hf]``).

:class:`HFStageSplit` checks once that a wrapped model (:class:`~sc_workers.models.HFCausalLM`
or the critic's :class:`~sc_workers.models.HFValueModel`) can be split, and builds its
stages: :class:`HFStage` keeps the input embeddings on the first stage, its decoder layers
on every stage, the final norm and the output head (``lm_head``, or the critic's ``score``)
on the last, each under its name in the wrapped model (``model.model.layers.3.mlp.up_proj``
in an actor, ``model.layers.3.mlp.up_proj`` in a critic).

A stage runs what the decoder's own ``forward`` runs between those parts: rotary position
embeddings from ``position_ids`` (the model's rotary module, on every stage), the attention
masks built from the 2-D ``attention_mask`` by transformers' ``create_causal_mask`` /
``create_sliding_window_causal_mask`` for the attention implementation the config selects,
and each decoder layer called as the model calls it, without a key/value cache. Llama,
Mistral, Qwen2 and Qwen3 decoders are covered (:data:`SPLITTABLE`); they differ only in
which layers attend through a sliding window.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from .._errors import OptionalDependencyError, UnsupportedParallelismError
from ._hf import HFCausalLM, HFValueModel, hf_text_config
from ._stage import ModelStage, StageHead, graft

__all__ = ["SPLITTABLE", "HFStage", "HFStageSplit"]

#: model types whose decoders split into stages, and how a layer's attention type is read:
#: "full" (every layer causal), "window" (every layer through the config's sliding_window
#: when it has one), "layer_types" (per layer, from the config's layer_types)
SPLITTABLE: dict[str, str] = {
    "llama": "full",
    "mistral": "window",
    "qwen2": "layer_types",
    "qwen3": "layer_types",
}

_FULL, _SLIDING = "full_attention", "sliding_attention"


def _masking_functions() -> dict[str, Callable[..., Any]]:
    try:
        masking = importlib.import_module("transformers.masking_utils")
    except ImportError as exc:
        raise OptionalDependencyError(
            "splitting a Hugging Face model into pipeline stages needs transformers: "
            "install sc-workers[hf]"
        ) from exc
    return {
        _FULL: masking.create_causal_mask,
        _SLIDING: masking.create_sliding_window_causal_mask,
    }


def _layer_kinds(config: Any, rule: str, count: int, where: str) -> list[str]:
    if rule == "full":
        return [_FULL] * count
    if rule == "window":
        return [_SLIDING if getattr(config, "sliding_window", None) else _FULL] * count
    kinds = list(getattr(config, "layer_types", None) or [_FULL] * count)[:count]
    unknown = sorted({k for k in kinds if k not in (_FULL, _SLIDING)})
    if len(kinds) != count or unknown:
        raise UnsupportedParallelismError(
            f"{where}: the {config.model_type} config's layer_types {kinds!r} are not one "
            f"of {_FULL!r} / {_SLIDING!r} per decoder layer ({count}); pipeline stages "
            "build only those masks"
        )
    return kinds


class _Masks:
    """Builds a decoder's attention masks as its forward does, from the 2-D
    ``attention_mask``, without a cache (the argument names follow the installed
    transformers: ``inputs_embeds`` / ``input_embeds``, ``cache`` / ``past_key_values``,
    ``cache_position`` where it is still taken)."""

    def __init__(self, config: Any) -> None:
        self.config = config
        self.functions = _masking_functions()
        params = inspect.signature(self.functions[_FULL]).parameters
        self.embeds = "inputs_embeds" if "inputs_embeds" in params else "input_embeds"
        self.cache = next((n for n in ("cache", "past_key_values") if n in params), None)
        self.cache_position = "cache_position" in params

    def __call__(
        self, kinds: set[str], hidden: Tensor, attention_mask: Tensor, position_ids: Tensor
    ) -> dict[str, Any]:
        """The masks of the attention types ``kinds`` for ``hidden`` ``[b, s, h]``."""
        kwargs: dict[str, Any] = {
            "config": self.config,
            self.embeds: hidden,
            "attention_mask": attention_mask,
            "position_ids": position_ids,
        }
        if self.cache is not None:
            kwargs[self.cache] = None
        if self.cache_position:
            kwargs["cache_position"] = torch.arange(hidden.shape[1], device=hidden.device)
        return {kind: self.functions[kind](**kwargs) for kind in kinds}


@dataclasses.dataclass(frozen=True)
class _Part:
    """A module of the wrapped model and its dotted name there."""

    name: str
    module: nn.Module


class HFStageSplit:
    """How one wrapped Hugging Face decoder splits into pipeline stages.

    ``blocks`` are its decoder layers as :func:`~sc_workers.engine.block_modules` finds
    them; they must be the decoder's ``layers``, in order. Raises
    :class:`UnsupportedParallelismError` (``where`` names the rank and setting) for an
    architecture outside :data:`SPLITTABLE`, a decoder without the Llama-style parts
    (``embed_tokens``, ``layers``, ``norm``, ``rotary_emb``), and a causal LM whose input
    and output embeddings are one tied weight (it would live on the first and the last
    stage). :meth:`stage` builds the stages; they share the wrapped model's modules.
    """

    def __init__(
        self, module: HFCausalLM | HFValueModel, blocks: Sequence[nn.Module], where: str
    ) -> None:
        self.where = where
        self.kind = "causal_lm" if isinstance(module, HFCausalLM) else "value_model"
        arch = type(module.model).__name__
        config = hf_text_config(module.hf_config)
        model_type = getattr(config, "model_type", None)
        rule = SPLITTABLE.get(str(model_type))
        if rule is None:
            raise UnsupportedParallelismError(
                f"{where}: {arch} (model_type {model_type!r}) cannot be split into pipeline "
                f"stages; splittable decoders: {', '.join(sorted(SPLITTABLE))}"
            )
        names = {id(m): n for n, m in module.named_modules(remove_duplicate=False)}
        if not blocks or any(id(b) not in names for b in blocks):
            raise UnsupportedParallelismError(f"{where}: found no decoder layers in {arch}")
        first_name = names[id(blocks[0])]
        backbone_name, container, _ = [*first_name.rsplit(".", 2), "", ""][:3]
        if container != "layers":
            raise UnsupportedParallelismError(
                f"{where}: the decoder layers of {arch} are not a ModuleList named 'layers' "
                f"(the first is {first_name!r})"
            )
        backbone: Any = module.get_submodule(backbone_name)
        layers = getattr(backbone, "layers", None)
        missing = [
            attr
            for attr in ("embed_tokens", "norm", "rotary_emb")
            if not isinstance(getattr(backbone, attr, None), nn.Module)
        ]
        if not isinstance(layers, nn.ModuleList) or missing:
            raise UnsupportedParallelismError(
                f"{where}: {type(backbone).__name__} of {arch} lacks the Llama-style parts "
                f"{missing or ['layers']}; pipeline stages split Llama/Qwen2-style decoders"
            )
        count = min(len(layers), int(getattr(backbone.config, "num_hidden_layers", len(layers))))
        if [id(b) for b in blocks] != [id(layer) for layer in layers[:count]]:
            raise UnsupportedParallelismError(
                f"{where}: the decoder layers of {arch} are not {backbone_name}.layers in order"
            )
        hf_model: Any = module.model
        embed: nn.Module = backbone.embed_tokens
        head: Any = (
            hf_model.get_output_embeddings() if isinstance(module, HFCausalLM) else module.score
        )
        if not isinstance(head, nn.Module) or id(head) not in names:
            raise UnsupportedParallelismError(
                f"{where}: {arch} has no output embeddings (get_output_embeddings) to put on "
                "the last pipeline stage"
            )
        if getattr(head, "weight", None) is getattr(embed, "weight", False):
            raise UnsupportedParallelismError(
                f"{where}: {arch} ties its input and output embeddings (tie_word_embeddings), "
                "one weight on the first and the last pipeline stage; pipeline parallelism "
                "needs a checkpoint with untied embeddings"
            )

        def part(sub: nn.Module) -> _Part:
            return _Part(names[id(sub)], sub)

        self.config = backbone.config
        self.model_type = str(model_type)
        self.embed = part(embed)
        self.layers = [part(layer) for layer in layers[:count]]
        self.norm = part(backbone.norm)
        self.rotary = part(backbone.rotary_emb)
        self.head = part(head)
        self.layer_kinds = _layer_kinds(config, rule, count, where)
        self.masks = _Masks(backbone.config)

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def stage(self, layers: range, first: bool, last: bool) -> HFStage:
        """The stage running decoder layers ``layers`` (with the embeddings when ``first``,
        the norm and head when ``last``)."""
        return HFStage(self, layers, first, last)


class HFStage(ModelStage):
    """One pipeline stage of a Hugging Face decoder (built by :meth:`HFStageSplit.stage`).

    Its modules are registered under their names in the wrapped model, so its
    ``named_parameters()`` are a subset of the whole model's; the calling convention is
    :class:`~sc_workers.models.ModelStage`'s.
    """

    def __init__(self, split: HFStageSplit, layers: range, first: bool, last: bool) -> None:
        super().__init__(first, last)
        # only this stage's parts: the split holds every layer of the model
        self.value_head = split.kind == "value_model"
        self._config = split.config
        self._masks = split.masks
        self._embed = split.embed if first else None
        self._rotary = split.rotary
        self._norm = split.norm if last else None
        self._head = split.head if last else None
        self._layers = [(split.layers[i], split.layer_kinds[i]) for i in layers]
        self._kinds = {kind for _, kind in self._layers}
        for part in self._parts():
            graft(self, part.name, part.module)

    def _parts(self) -> list[_Part]:
        layers = [part for part, _ in self._layers]
        parts = [self._embed, *layers, self._rotary, self._norm, self._head]
        return [p for p in parts if p is not None]

    @property
    def hf_config(self) -> Any:
        return self._config

    @property
    def embed_tokens(self) -> nn.Module | None:
        """The input embeddings on the first stage, else None."""
        return self._embed.module if self._embed is not None else None

    @property
    def output_head(self) -> nn.Module | None:
        """The causal LM's output head on the last stage, else None (and for a critic)."""
        return self._head.module if self._head is not None and not self.value_head else None

    def parts(self) -> dict[str, nn.Module]:
        return {p.name: p.module for p in self._parts()}

    def blocks(self) -> list[nn.Module]:
        return [part.module for part, _ in self._layers]

    def forward(
        self,
        x: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        head: StageHead | None = None,
    ) -> Any:
        hidden: Tensor = self._embed.module(x) if self._embed is not None else x
        masks = self._masks(self._kinds, hidden, attention_mask, position_ids)
        position_embeddings = self._rotary.module(hidden, position_ids)
        for part, kind in self._layers:
            out = part.module(
                hidden,
                attention_mask=masks[kind],
                position_embeddings=position_embeddings,
                position_ids=position_ids,
            )
            hidden = out[0] if isinstance(out, tuple) else out
        if self._norm is None or self._head is None:
            return hidden, attention_mask, position_ids
        logits: Tensor = self._head.module(self._norm.module(hidden))
        if self.value_head:
            logits = logits.squeeze(-1)
        if head is not None:
            return head(logits)
        return logits.clone() if logits._base is not None else logits
