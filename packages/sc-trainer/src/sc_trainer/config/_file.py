"""A config file and dotted overrides, read into a :class:`~sc_trainer.TrainerConfig`, and the
resolved configuration written back.

A file is YAML, nested as verl's (``data: {train_files: [...]}``) or with dotted keys
(``data.train_files: [...]``); overrides are ``key=value`` with the value read as YAML
(``trainer.logger=[console,tensorboard]``, ``actor_rollout_ref.actor.optim.lr=1e-5``). Every
key must be one of ``_keys.py``'s: an unknown key is a :class:`TrainerConfigError` naming the
nearest known one. :func:`resolved_document` writes every key with the value the run uses;
reading that document back gives the same configuration (:func:`config_from_document`).
:func:`config_from_dict` rebuilds a configuration from ``dataclasses.asdict`` (a checkpoint's
trainer state).
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union

import yaml

from .._errors import TrainerConfigError
from ._keys import DERIVED, VERL_ONLY, Key, keys_by_name
from ._trainer import TrainerConfig

__all__ = [
    "config_from_dict",
    "config_from_document",
    "load_document",
    "parse_overrides",
    "resolved_document",
    "write_document",
]

D = TypeVar("D")

#: values ``sc-train`` starts from where they differ from ``TrainerConfig``'s defaults: a run
#: of the command continues from its own checkpoints, prints a line per step, and writes to
#: a folder of its own
TRAIN_DEFAULTS: dict[str, Any] = {
    "trainer.resume_mode": "auto",
    "trainer.logger": ["console"],
    "trainer.default_local_dir": "sc-train-output",
}


def _flatten(document: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested mapping as dotted keys to leaf values (lists are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in document.items():
        if not isinstance(key, str) or not key:
            raise TrainerConfigError(f"config: keys are non-empty strings, got {key!r}")
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, f"{name}."))
        else:
            flat[name] = value
    return flat


def _nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    nested: dict[str, Any] = {}
    for name, value in flat.items():
        node = nested
        *parents, leaf = name.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def _nearest(name: str, known: Iterable[str]) -> str:
    """The nearest known keys to ``name``, in words for an error message: the keys with the
    same last part if there are some (``trainer.lr``: ``actor_rollout_ref.actor.optim.lr``
    or ``critic.optim.lr``), else the closest spelling."""
    candidates = list(known)
    leaf = name.rpartition(".")[2]
    close = [c for c in candidates if c.rpartition(".")[2] == leaf][:3]
    if not close:
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.3)
    if not close:
        return "no known key is near it"
    if len(close) == 1:
        return f"the nearest known key is {close[0]!r}"
    return "the nearest known keys are " + " or ".join(repr(c) for c in close)


def _check_known(flat: Mapping[str, Any], where: str) -> None:
    known = keys_by_name()
    for name in flat:
        if name in known:
            continue
        if name in VERL_ONLY:
            raise TrainerConfigError(
                f"{where}: {name!r} is verl's, and sc has no counterpart: {VERL_ONLY[name]}; "
                "remove it"
            )
        raise TrainerConfigError(
            f"{where}: unknown key {name!r}; {_nearest(name, known)} (sc-train --help-keys "
            "lists every key)"
        )


def load_document(path: str | Path) -> dict[str, Any]:
    """The dotted keys and values of the YAML config file ``path`` (checked: every key known)."""
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TrainerConfigError(f"config file {str(file)!r} does not exist") from None
    except OSError as err:
        raise TrainerConfigError(f"config file {str(file)!r} cannot be read: {err}") from err
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise TrainerConfigError(f"config file {str(file)!r} is not valid YAML: {err}") from err
    if document is None:
        return {}
    if not isinstance(document, Mapping):
        raise TrainerConfigError(
            f"config file {str(file)!r} must hold a mapping of keys, got {type(document).__name__}"
        )
    flat = _flatten(document)
    _check_known(flat, f"config file {str(file)!r}")
    return flat


def parse_overrides(items: Sequence[str]) -> dict[str, Any]:
    """``key=value`` items as dotted keys and values (each value read as YAML)."""
    flat: dict[str, Any] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise TrainerConfigError(f"override {item!r} must look like key=value")
        try:
            flat[name] = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as err:
            raise TrainerConfigError(f"override {item!r}: the value is not YAML: {err}") from err
    _check_known(flat, "override")
    return flat


# ------------------------------------------------------------------ values and types
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _field_type(path: str) -> Any:
    """The type hint of the dotted field ``path`` of TrainerConfig."""
    cls: Any = TrainerConfig
    *parents, leaf = path.split(".")
    for part in parents:
        cls = _hints(cls)[part]
    return _hints(cls)[leaf]


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """``value`` (as YAML read it) as a value of type ``hint``: a float written ``1e-5``
    (which YAML 1.1 reads as a string), an int for a float, a list for a tuple. What does not
    fit is left for the configuration's own checks, which name the field."""
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where) if len(args) == 1 else value
    if origin is Literal:
        return value
    if hint is float and isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            raise TrainerConfigError(f"{where} must be a number, got {value!r}") from None
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if origin is tuple and isinstance(value, list):
        return tuple(value)
    return value


def config_from_dict(cls: type[D], data: Mapping[str, Any]) -> D:
    """The dataclass ``cls`` from ``data`` as ``dataclasses.asdict`` wrote it (nested
    configurations as mappings, tuples as lists): a checkpoint's saved configuration."""
    if not isinstance(data, Mapping):
        raise TrainerConfigError(f"{cls.__name__}: expected a mapping, got {data!r}")
    hints = _hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names)
    if unknown:
        raise TrainerConfigError(f"{cls.__name__}: unknown fields {unknown}")
    kwargs: dict[str, Any] = {}
    for name, value in data.items():
        hint = hints[name]
        if isinstance(hint, type) and dataclasses.is_dataclass(hint):
            kwargs[name] = config_from_dict(hint, value)
        else:
            kwargs[name] = _coerce(value, hint, f"{cls.__name__}.{name}")
    return cls(**kwargs)


# ------------------------------------------------------------------ documents
def _fields_of(config: TrainerConfig) -> dict[str, Any]:
    return _flatten_fields(dataclasses.asdict(config))


def _flatten_fields(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for name, value in data.items():
        if isinstance(value, Mapping):
            flat.update(_flatten_fields(value, f"{prefix}{name}."))
        else:
            flat[f"{prefix}{name}"] = value
    return flat


def _apply(fields: dict[str, Any], key: Key, value: Any) -> None:
    loaded = key.load(value) if key.load is not None else value
    fields[key.field] = _coerce(loaded, _field_type(key.field), key.name)


def _apply_derived(fields: dict[str, Any], given: Mapping[str, Any]) -> None:
    """The derived keys (``_keys.DERIVED``), after every plain one."""
    a = "actor_rollout_ref.actor."
    mini = given.get(f"{a}ppo_mini_batch_size")
    if mini is not None:
        prompts = fields["prompts_per_step"]
        if isinstance(mini, bool) or not isinstance(mini, int) or mini < 1 or prompts % mini:
            raise TrainerConfigError(
                f"{a}ppo_mini_batch_size={mini!r} must be an int >= 1 that divides "
                f"data.train_batch_size={prompts}"
            )
        fields["ppo_mini_batches"] = prompts // mini
    use_kl, coef = given.get(f"{a}use_kl_loss"), given.get(f"{a}kl_loss_coef")
    if coef is not None:
        fields["kl_coef"] = _coerce(coef, float, f"{a}kl_loss_coef")
    if use_kl is not None:
        if not isinstance(use_kl, bool):
            raise TrainerConfigError(f"{a}use_kl_loss must be true or false, got {use_kl!r}")
        if not use_kl:
            fields["kl_coef"] = 0.0
    per_node = given.get("trainer.n_gpus_per_node")
    if per_node is not None:
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise TrainerConfigError(
                f"trainer.n_gpus_per_node must be an int >= 1, got {per_node!r}"
            )
        fields["workers_per_role"] = per_node * fields["nnodes"]


def config_from_document(
    document: Mapping[str, Any], base: Mapping[str, Any] | None = None
) -> TrainerConfig:
    """The configuration that the dotted keys of ``document`` ask for, over the defaults of
    ``TrainerConfig`` and then ``base`` (more dotted keys: ``sc-train``'s own defaults)."""
    given = {**(base or {}), **document}
    _check_known(given, "config")
    keys = keys_by_name()
    fields = _fields_of(TrainerConfig())
    for name, value in given.items():
        key = keys[name]
        if name not in DERIVED:
            _apply(fields, key, value)
    _apply_derived(fields, given)
    return config_from_dict(TrainerConfig, _nest(fields))


def resolved_document(config: TrainerConfig) -> dict[str, Any]:
    """Every key with the value ``config`` gives it, nested as a config file (the file
    :func:`config_from_document` reads back into the same configuration)."""
    fields = _fields_of(config)
    flat: dict[str, Any] = {}
    for key in keys_by_name().values():
        if key.name in DERIVED:
            continue
        value = fields[key.field]
        flat[key.name] = key.dump(value) if key.dump is not None else _plain(value)
    a = "actor_rollout_ref.actor."
    flat[f"{a}ppo_mini_batch_size"] = config.prompts_per_step // config.ppo_mini_batches
    flat[f"{a}use_kl_loss"] = config.kl_coef > 0
    flat[f"{a}kl_loss_coef"] = config.kl_coef
    flat["trainer.n_gpus_per_node"] = config.workers_per_role // config.nnodes
    order = {key.name: i for i, key in enumerate(keys_by_name().values())}
    return _nest(dict(sorted(flat.items(), key=lambda item: order[item[0]])))


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def write_document(config: TrainerConfig, path: str | Path) -> Path:
    """Write :func:`resolved_document` of ``config`` as YAML to ``path``; returns it."""
    file = Path(path)
    file.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(resolved_document(config), sort_keys=False, default_flow_style=False)
    tmp = file.with_name(f".{file.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(file)
    return file
