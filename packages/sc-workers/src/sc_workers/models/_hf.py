"""Local Hugging Face models behind the built-in model's interface (extra ``sc-workers[hf]``).

``transformers`` is imported only when one of these functions runs, and only local
directories are read (``local_files_only=True``): nothing is downloaded.

* :class:`HFCausalLM` — any ``AutoModelForCausalLM`` (actor, reference, rollout): logits,
  and incremental decoding with transformers' own key/value cache (:class:`HFCache`).
* :class:`HFValueModel` — the critic: the checkpoint's base model (``AutoModel``, so any
  causal-LM checkpoint loads) and a scalar head ``score`` (``Linear(hidden_size, 1)``).
  Its state dict has the layout of transformers' ``<Arch>ForTokenClassification`` with one
  label, which is how :func:`save_hf_model` writes it back.
* :func:`load_hf_tokenizer`, :func:`save_hf_model`, :func:`check_hf_tensor_parallel`.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .._errors import BatchError, CheckpointError, ConfigError, OptionalDependencyError
from ._ulysses import SP_KWARG, ULYSSES_ATTENTION, SequenceParallel, causal_padding_mask

__all__ = [
    "HFCache",
    "HFCausalLM",
    "HFModelKind",
    "HFValueModel",
    "check_hf_tensor_parallel",
    "copy_hf_side_files",
    "hf_text_config",
    "import_transformers",
    "load_hf_model",
    "load_hf_tokenizer",
    "save_hf_model",
]

logger = logging.getLogger(__name__)

#: what an engine holds: a causal LM (actor, reference, rollout) or a value model (critic)
HFModelKind = Literal["causal_lm", "value_model"]

#: weight files of a Hugging Face directory (everything else is config, tokenizer, code)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf")
_WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def import_transformers(purpose: str) -> Any:
    """The ``transformers`` module; :class:`OptionalDependencyError` names ``purpose``."""
    try:
        return importlib.import_module("transformers")
    except ImportError as exc:
        raise OptionalDependencyError(
            f"{purpose} needs transformers: install sc-workers[hf]"
        ) from exc


def _check_model_dir(path: str, what: str) -> None:
    if not (Path(path) / "config.json").is_file():
        raise ConfigError(
            f"{what} {path!r} is not a local Hugging Face model directory (no config.json); "
            "sc-workers reads local directories only and downloads nothing"
        )


def hf_text_config(config: Any) -> Any:
    """The language-model part of a (possibly multimodal) transformers config."""
    get_text_config = getattr(config, "get_text_config", None)
    return get_text_config() if callable(get_text_config) else config


class HFCache:
    """The key/value cache of one generation call on an :class:`HFCausalLM`.

    Holds transformers' ``Cache`` object, which the model creates on the first forward
    (the prompt) and extends on each following one (one new token per sequence).
    """

    def __init__(self) -> None:
        self.cache: Any = None

    @property
    def length(self) -> int:
        """Tokens already in the cache (0 before the first forward)."""
        return 0 if self.cache is None else int(self.cache.get_seq_length())


def _cache_of(output: Mapping[str, Any]) -> Any:
    # transformers 5 names the output field ``cache``; earlier versions ``past_key_values``
    for key in ("cache", "past_key_values"):
        if key in output:
            return output[key]
    return None


def _sequence_parallel_args(
    model: nn.Module,
    input_ids: Tensor,
    attention_mask: Tensor,
    sp: SequenceParallel,
    kwargs: dict[str, Any],
) -> Tensor:
    """The full ``[b, 1, s, s]`` mask for a sequence-sharded forward (transformers passes a
    4-D mask through as is), with ``sp`` added to ``kwargs`` for the attention function."""
    config: Any = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != ULYSSES_ATTENTION:
        raise ConfigError(
            f"{type(model).__name__}: a sequence_parallel forward needs the Ulysses attention "
            "implementation (enable_hf_sequence_parallel); the FSDP engine sets it when "
            "ulysses_sequence_parallel_size > 1"
        )
    b, s = input_ids.shape
    if tuple(attention_mask.shape) != (b, s * sp.size):
        raise BatchError(
            f"{type(model).__name__} (sp rank {sp.rank}): attention_mask shape "
            f"{tuple(attention_mask.shape)} does not match batch {b} x (shard {s} x sp size "
            f"{sp.size}) tokens"
        )
    kwargs[SP_KWARG] = sp
    return causal_padding_mask(attention_mask)


class HFCausalLM(nn.Module):
    """A transformers causal LM: ``forward(input_ids, attention_mask, position_ids, cache=None)``.

    Returns logits ``[batch, seq, vocab]``. With an :class:`HFCache` (from
    :meth:`new_cache`), ``input_ids`` holds only the tokens not yet in the cache,
    ``attention_mask`` covers the cached tokens plus the new ones, and the logits are
    those of the last new token only (``[batch, 1, vocab]``, where the model supports
    ``logits_to_keep``). With ``sequence_parallel`` (after
    :func:`~._hf_ulysses.enable_hf_sequence_parallel`), ``input_ids`` and ``position_ids``
    are this rank's shard of the sequence, ``attention_mask`` the whole sequence's, and
    the logits the shard's.
    """

    supports_kv_cache = True

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        params = inspect.signature(model.forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params

    @property
    def hf_config(self) -> Any:
        return self.model.config

    def new_cache(self) -> HFCache:
        return HFCache()

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: HFCache | None = None,
        sequence_parallel: SequenceParallel | None = None,
    ) -> Tensor:
        kwargs: dict[str, Any] = {"use_cache": cache is not None}
        if sequence_parallel is not None:
            if cache is not None:
                raise BatchError(
                    "HFCausalLM: a key/value cache is not combined with sequence_parallel"
                )
            attention_mask = _sequence_parallel_args(
                self.model, input_ids, attention_mask, sequence_parallel, kwargs
            )
        if cache is not None:
            if not isinstance(cache, HFCache):
                raise BatchError(
                    f"HFCausalLM takes an HFCache (from new_cache()), got {type(cache).__name__}"
                )
            b, s = input_ids.shape
            past = cache.length
            if tuple(attention_mask.shape) != (b, past + s):
                raise BatchError(
                    f"attention_mask shape {tuple(attention_mask.shape)} does not match "
                    f"batch {b} x (cached {past} + new {s}) tokens"
                )
            kwargs[self._cache_arg] = cache.cache
            if self._keeps_logits:
                kwargs["logits_to_keep"] = 1
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **kwargs,
        )
        if cache is not None:
            cache.cache = _cache_of(out)
            if cache.cache is None:
                raise ConfigError(
                    f"{type(self.model).__name__} returned no key/value cache with use_cache=True"
                )
        logits: Tensor = out.logits
        if logits._base is not None:  # e.g. the output head's all-gather under TP
            logits = logits.clone()  # not a view: FSDP hooks the root's output
        return logits


class HFValueModel(nn.Module):
    """A critic: a transformers base model and a scalar head, ``[batch, seq]`` values.

    ``model`` is the backbone (what ``AutoModel`` loads from a causal-LM checkpoint) and
    ``score`` a ``Linear(hidden_size, 1)``; the head reads the backbone's last hidden state
    (no dropout).
    """

    supports_kv_cache = False

    def __init__(self, backbone: nn.Module, score: nn.Linear) -> None:
        super().__init__()
        self.model = backbone
        self.score = score

    @property
    def hf_config(self) -> Any:
        return self.model.config

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
        sequence_parallel: SequenceParallel | None = None,
    ) -> Tensor:
        if cache is not None:
            raise ConfigError("HFValueModel (a critic) does not take a key/value cache")
        kwargs: dict[str, Any] = {"use_cache": False}
        if sequence_parallel is not None:
            attention_mask = _sequence_parallel_args(
                self.model, input_ids, attention_mask, sequence_parallel, kwargs
            )
        out = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            **kwargs,
        )
        hidden: Tensor = out.last_hidden_state
        values: Tensor = self.score(hidden).squeeze(-1)
        return values.clone()  # not a view: FSDP hooks the root's output


def _load_value_model(transformers: Any, path: str) -> HFValueModel:
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    architectures = getattr(config, "architectures", None) or []
    if getattr(config, "num_labels", None) == 1 and any(
        str(a).endswith("ForTokenClassification") for a in architectures
    ):
        # a critic written by save_hf_model (or a one-label token classifier): keep its head
        classifier = transformers.AutoModelForTokenClassification.from_pretrained(
            path, local_files_only=True
        )
        backbone = getattr(classifier, classifier.base_model_prefix)
        score = getattr(classifier, "score", None)
        if not isinstance(score, nn.Linear) or score.out_features != 1:
            raise ConfigError(
                f"model.path {path!r}: {type(classifier).__name__} has no one-output "
                "'score' layer to use as the value head"
            )
        return HFValueModel(backbone, score)
    backbone = transformers.AutoModel.from_pretrained(path, local_files_only=True)
    hidden = int(hf_text_config(backbone.config).hidden_size)
    score = nn.Linear(hidden, 1)
    nn.init.normal_(score.weight, mean=0.0, std=float(getattr(config, "initializer_range", 0.02)))
    nn.init.zeros_(score.bias)
    return HFValueModel(backbone, score)


def load_hf_model(path: str, value_head: bool, dtype: torch.dtype, seed: int = 0) -> nn.Module:
    """Load the model at ``path``: an :class:`HFCausalLM`, or with ``value_head`` an
    :class:`HFValueModel`, in ``dtype``.

    ``seed`` seeds whatever the checkpoint does not hold (a new value head), so that every
    rank builds the same initial weights.
    """
    transformers = import_transformers(f"model.path {path!r}")
    _check_model_dir(path, "model.path")
    module: nn.Module
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if value_head:
            module = _load_value_model(transformers, path)
        else:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
            module = HFCausalLM(model)
    module = module.to(dtype)
    logger.info("loaded %s (%s) from %s", type(module).__name__, module.hf_config.model_type, path)
    return module


def load_hf_tokenizer(path: str) -> Any:
    """The tokenizer of the model directory ``path`` (``AutoTokenizer``, local files only).

    A tokenizer without a padding token gets its eos token as the padding token (the
    workers mask padding through ``attention_mask``, so the id only fills the gaps).
    """
    transformers = import_transformers(f"the tokenizer at {path!r}")
    _check_model_dir(path, "tokenizer path")
    tokenizer = transformers.AutoTokenizer.from_pretrained(path, local_files_only=True)
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        logger.info("tokenizer at %s has no pad token; using eos %r", path, tokenizer.eos_token)
    return tokenizer


def check_hf_tensor_parallel(config: Any, tp: int, where: str) -> None:
    """Head counts and MLP width of a transformers config must be divisible by ``tp``."""
    if tp == 1:
        return
    text = hf_text_config(config)
    heads = getattr(text, "num_attention_heads", None)
    values = {
        "num_attention_heads": heads,
        "num_key_value_heads": getattr(text, "num_key_value_heads", None) or heads,
        "intermediate_size": getattr(text, "intermediate_size", None),
    }
    for name, value in values.items():
        if not isinstance(value, int):
            raise ConfigError(
                f"{where}: the {getattr(text, 'model_type', '?')} config has no integer {name} "
                f"(got {value!r}); tensor parallelism covers Llama/Qwen2-style decoder layers"
            )
        if value % tp:
            raise ConfigError(
                f"{where}: {name} {value} is not divisible by tensor_model_parallel_size {tp}"
            )


def _is_weight_file(name: str) -> bool:
    return name.endswith(_WEIGHT_SUFFIXES) or name in _WEIGHT_INDEXES


def copy_hf_side_files(
    source: str | os.PathLike[str], target: str | os.PathLike[str], include_config: bool
) -> None:
    """Copy a model directory's files other than weights (tokenizer, generation config,
    chat template, custom code), and ``config.json`` when ``include_config``."""
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    for item in sorted(Path(source).iterdir()):
        if not item.is_file() or _is_weight_file(item.name):
            continue
        if item.name == "config.json" and not include_config:
            continue
        shutil.copy2(item, target / item.name)


def _strip(prefix: str, state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def save_hf_model(
    state_dict: Mapping[str, Tensor],
    kind: HFModelKind,
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str],
) -> None:
    """Write full weights as a ``save_pretrained`` directory, with the config and tokenizer.

    ``state_dict`` holds the parameter names of an :class:`HFCausalLM` or
    :class:`HFValueModel` (``model.…``, ``score.…``) as full tensors; ``source`` is the
    directory the model was loaded from (its config, tokenizer and other side files are
    reused). A causal LM loads back with ``AutoModelForCausalLM``; a value model is
    written as ``<Arch>ForTokenClassification`` with one label and loads back with
    ``AutoModelForTokenClassification`` (and as a critic through ``model.path``). The
    directory appears complete or not at all (written next to it, then renamed).
    """
    transformers = import_transformers("exporting a Hugging Face model")
    _check_model_dir(str(source), "Hugging Face source directory")
    config = transformers.AutoConfig.from_pretrained(str(source), local_files_only=True)
    hf_state = _strip("model.", state_dict)
    if kind == "causal_lm":
        auto = transformers.AutoModelForCausalLM
    else:
        auto = transformers.AutoModelForTokenClassification
        config.num_labels = 1
    with torch.device("meta"):
        model = auto.from_config(config)
    if kind == "value_model":
        prefix = model.base_model_prefix
        backbone = {f"{prefix}.{k}": v for k, v in hf_state.items()}
        hf_state = {
            **backbone,
            **{f"score.{k}": v for k, v in _strip("score.", state_dict).items()},
        }
    result = model.load_state_dict(hf_state, strict=False, assign=True)
    if result.unexpected_keys:
        raise CheckpointError(
            f"export to {out_dir}: {type(model).__name__} has no parameters "
            f"{sorted(result.unexpected_keys)[:5]}"
        )
    model.tie_weights()
    still_meta = sorted(k for k, v in model.state_dict().items() if v.is_meta)
    if still_meta:
        raise CheckpointError(
            f"export to {out_dir}: the state dict lacks {still_meta[:5]} "
            f"({len(still_meta)} tensors) for {type(model).__name__}"
        )
    final = Path(out_dir)
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    copy_hf_side_files(source, tmp, include_config=False)
    old = final.with_name(final.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if final.exists():
        os.replace(final, old)
    os.replace(tmp, final)
    shutil.rmtree(old, ignore_errors=True)
    logger.info("exported %s (%s) to %s", type(model).__name__, kind, final)
