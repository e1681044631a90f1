"""The dispatch-mode registry and every predefined dispatch and collect function.

A dispatch function has the signature ``dispatch_fn(worker_group, *args, **kwargs)`` and
returns ``(args, kwargs)`` in which every value is a list with one entry per rank (for
``Execute.ALL``) or the arguments as they are (for ``Execute.RANK_ZERO``). A splitting
dispatch function that padded the batch records the number of padding rows in the returned
keyword arguments under :data:`PADDING_SIZE_KEY`; the worker group pops it (see
:func:`pop_padding_size`) before the call and removes the padding from the collected output.
A collect function has the signature ``collect_fn(worker_group, outputs)`` where ``outputs``
has one entry per executed rank.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

from ._enums import Dispatch, Execute
from ._errors import (
    DirectRolloutCallError,
    DispatchArgumentError,
    DispatchModeExistsError,
    DispatchModeTypeError,
    InvalidDispatchModeError,
    NotShardableError,
    UnknownDispatchModeError,
)
from ._protocols import DispatchWorkerGroup
from ._shard import _describe, get_shard_adapter, split_args_kwargs

__all__ = [
    "PADDING_SIZE_KEY",
    "CollectFn",
    "DispatchFn",
    "DispatchFnDict",
    "DispatchModeSpec",
    "ExecuteFnDict",
    "collect_all_to_all",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "collect_direct_rollout_method",
    "collect_rank_zero",
    "dispatch_all_to_all",
    "dispatch_direct_rollout_method",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_one_to_all",
    "dispatch_rank_zero",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
    "pop_padding_size",
    "register_dispatch_mode",
    "resolve_dispatch_mode",
    "update_dispatch_mode",
]

#: Keyword under which a splitting dispatch function reports the padding rows it added.
PADDING_SIZE_KEY = "_sc_padding_size"

DispatchFn = Callable[..., tuple[Sequence[Any], dict[str, Any]]]
CollectFn = Callable[[Any, Sequence[Any]], Any]


class DispatchFnDict(TypedDict):
    """verl's spelling of a dispatch mode: ``{"dispatch_fn": ..., "collect_fn": ...}``."""

    dispatch_fn: DispatchFn
    collect_fn: CollectFn


class ExecuteFnDict(TypedDict):
    """Names the worker-group method that runs a call: ``execute_all`` or ``execute_rank_zero``."""

    execute_fn_name: Literal["execute_all", "execute_rank_zero"]


@dataclass(frozen=True)
class DispatchModeSpec:
    """A resolved dispatch mode.

    ``unpad_output`` says whether the collected output is row-aligned with the input, so
    that padding rows added by the dispatch are dropped from it. It is ``False`` for
    modes that collect one value per worker (``DP_COMPUTE_METRIC``): every worker's value
    is kept.

    ``joins_shards`` says that ``collect_fn`` joins the per-rank shards of a row-split batch
    (``DP_COMPUTE_PROTO``, ``DP_COMPUTE_PROTO_WITH_FUNC``, N-d mesh modes). For a
    non-blocking call a backend then hands ``collect_fn`` futures that know their row counts,
    so that the joined future can be split again without fetching anything; every other mode
    receives the backend's plain handles (Ray object references on Ray), as in verl.
    """

    name: str
    dispatch_fn: DispatchFn
    collect_fn: CollectFn
    unpad_output: bool = True
    joins_shards: bool = False

    def __post_init__(self) -> None:
        for field in ("dispatch_fn", "collect_fn"):
            if not callable(getattr(self, field)):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be callable, "
                    f"got {getattr(self, field)!r}"
                )
        for field in ("unpad_output", "joins_shards"):
            if not isinstance(getattr(self, field), bool):
                raise DispatchModeTypeError(
                    f"dispatch mode {self.name}: {field} must be a bool, "
                    f"got {getattr(self, field)!r}"
                )


def pop_padding_size(kwargs: dict[str, Any]) -> int:
    """Remove and return the padding size a dispatch function recorded (0 when none)."""
    value = kwargs.pop(PADDING_SIZE_KEY, 0)
    return int(value)


def _world_size(worker_group: Any, mode: str) -> int:
    size = getattr(worker_group, "world_size", None)
    if not isinstance(size, int) or size < 1:
        raise DispatchArgumentError(
            f"{mode}: worker group {worker_group!r} has no positive integer world_size "
            f"(got {size!r})"
        )
    return size


# --- predefined dispatch and collect functions -------------------------------------------


def dispatch_rank_zero(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``RANK_ZERO``: the arguments go, as they are, to rank 0 only."""
    return args, kwargs


def collect_rank_zero(worker_group: DispatchWorkerGroup, output: Any) -> Any:
    """``RANK_ZERO``: rank 0's output, as it is."""
    return output


def dispatch_one_to_all(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[tuple[list[Any], ...], dict[str, list[Any]]]:
    """``ONE_TO_ALL``: every rank receives the same arguments (the same objects)."""
    n = _world_size(worker_group, "ONE_TO_ALL")
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``ALL_TO_ALL``: arguments pass through untouched; the backend decides."""
    return args, kwargs


def collect_all_to_all(worker_group: DispatchWorkerGroup, output: Sequence[Any]) -> Any:
    """``ONE_TO_ALL`` / ``ALL_TO_ALL``: the list of every rank's output, in rank order."""
    return output


def dispatch_dp_compute(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[tuple[list[Any], ...], dict[str, list[Any]]]:
    """``DP_COMPUTE``: each argument is a list or tuple with one entry per rank."""
    n = _world_size(worker_group, "DP_COMPUTE")
    named = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    for label, value in named:
        if not isinstance(value, (list, tuple)):
            raise NotShardableError(
                f"DP_COMPUTE: {label} must be a list or tuple with one entry per rank "
                f"(world size {n}), got {type(value).__qualname__} {_describe(value)}"
            )
        if len(value) != n:
            raise DispatchArgumentError(
                f"DP_COMPUTE: {label} has {len(value)} entries, expected the world size {n}"
            )
    return tuple(list(a) for a in args), {k: list(v) for k, v in kwargs.items()}


def collect_dp_compute(worker_group: DispatchWorkerGroup, output: Sequence[Any]) -> list[Any]:
    """``DP_COMPUTE`` / ``DP_COMPUTE_METRIC``: one output per rank, as a list."""
    n = _world_size(worker_group, "DP_COMPUTE")
    if len(output) != n:
        raise DispatchArgumentError(
            f"DP_COMPUTE: expected {n} outputs (one per rank), got {len(output)}"
        )
    return list(output)


def dispatch_dp_compute_data_proto(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[list[list[Any]], dict[str, Any]]:
    """``DP_COMPUTE_PROTO``: split every argument into world-size shards, padding if enabled."""
    n = _world_size(worker_group, "DP_COMPUTE_PROTO")
    split_args, split_kwargs, pad = split_args_kwargs("DP_COMPUTE_PROTO", n, args, kwargs)
    out_kwargs: dict[str, Any] = dict(split_kwargs)
    if pad:
        out_kwargs[PADDING_SIZE_KEY] = pad
    return split_args, out_kwargs


def dispatch_dp_compute_data_proto_with_func(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[list[list[Any]], dict[str, Any]]:
    """``DP_COMPUTE_PROTO_WITH_FUNC``: the first argument (a callable) goes to every rank;
    the rest are split as in ``DP_COMPUTE_PROTO``."""
    mode = "DP_COMPUTE_PROTO_WITH_FUNC"
    n = _world_size(worker_group, mode)
    if not args or not callable(args[0]):
        got = (
            f"{type(args[0]).__qualname__} {_describe(args[0])}"
            if args
            else "no positional argument"
        )
        raise NotShardableError(
            f"{mode}: the first positional argument must be callable, got {got}"
        )
    split_args, split_kwargs, pad = split_args_kwargs(mode, n, args[1:], kwargs)
    out_kwargs: dict[str, Any] = dict(split_kwargs)
    if pad:
        out_kwargs[PADDING_SIZE_KEY] = pad
    return [[args[0]] * n, *split_args], out_kwargs


def collect_dp_compute_data_proto(worker_group: DispatchWorkerGroup, output: Sequence[Any]) -> Any:
    """Join the per-rank outputs of a splitting mode into one batch, in rank order."""
    return concat_outputs("DP_COMPUTE_PROTO", output)


def concat_outputs(mode: str, output: Sequence[Any]) -> Any:
    """Concatenate shard outputs with the adapter of their type."""
    if not output:
        raise DispatchArgumentError(f"{mode}: no outputs to collect")
    kinds = {type(o) for o in output}
    if len(kinds) > 1:
        names = sorted(k.__qualname__ for k in kinds)
        raise NotShardableError(f"{mode}: outputs must all have one type to be joined, got {names}")
    adapter = get_shard_adapter(output[0])
    if adapter is None:
        raise NotShardableError(
            f"{mode}: outputs of type {type(output[0]).__qualname__} cannot be joined; "
            "return a list, tuple, DataProto or TensorDict, or use a mode that collects a list"
        )
    return adapter.concat(list(output))


def dispatch_direct_rollout_method(
    worker_group: DispatchWorkerGroup, *args: Any, **kwargs: Any
) -> tuple[Sequence[Any], dict[str, Any]]:
    """``DIRECT_ROLLOUT_METHOD``: called inside the worker by its rollout engine, never from
    the driver; a driver-side call is a :class:`~sc_dispatch.DirectRolloutCallError` (a
    ``NotImplementedError``, as in verl)."""
    raise DirectRolloutCallError(
        "DIRECT_ROLLOUT_METHOD: this method is called by the rollout engine inside the worker, "
        "not through the worker group"
    )


def collect_direct_rollout_method(worker_group: DispatchWorkerGroup, output: Any) -> Any:
    """``DIRECT_ROLLOUT_METHOD``: never reached from a worker group (see the dispatch)."""
    raise DirectRolloutCallError(
        "DIRECT_ROLLOUT_METHOD: this method is called by the rollout engine inside the worker, "
        "not through the worker group"
    )


# --- the registry ---------------------------------------------------------------------------

_lock = threading.Lock()
_registry: dict[Dispatch, DispatchModeSpec] = {}


def _spec(
    name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    unpad_output: bool = True,
    joins_shards: bool = False,
) -> DispatchModeSpec:
    return DispatchModeSpec(name, dispatch_fn, collect_fn, unpad_output, joins_shards)


def _install_predefined() -> None:
    _registry[Dispatch.RANK_ZERO] = _spec("RANK_ZERO", dispatch_rank_zero, collect_rank_zero)
    _registry[Dispatch.ONE_TO_ALL] = _spec("ONE_TO_ALL", dispatch_one_to_all, collect_all_to_all)
    _registry[Dispatch.ALL_TO_ALL] = _spec("ALL_TO_ALL", dispatch_all_to_all, collect_all_to_all)
    _registry[Dispatch.DP_COMPUTE] = _spec("DP_COMPUTE", dispatch_dp_compute, collect_dp_compute)
    _registry[Dispatch.DP_COMPUTE_PROTO] = _spec(
        "DP_COMPUTE_PROTO",
        dispatch_dp_compute_data_proto,
        collect_dp_compute_data_proto,
        joins_shards=True,
    )
    _registry[Dispatch.DP_COMPUTE_PROTO_WITH_FUNC] = _spec(
        "DP_COMPUTE_PROTO_WITH_FUNC",
        dispatch_dp_compute_data_proto_with_func,
        collect_dp_compute_data_proto,
        joins_shards=True,
    )
    _registry[Dispatch.DP_COMPUTE_METRIC] = _spec(
        "DP_COMPUTE_METRIC", dispatch_dp_compute_data_proto, collect_dp_compute, unpad_output=False
    )
    _registry[Dispatch.DIRECT_ROLLOUT_METHOD] = _spec(
        "DIRECT_ROLLOUT_METHOD", dispatch_direct_rollout_method, collect_direct_rollout_method
    )


_install_predefined()


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> DispatchFnDict:
    """verl's lookup: ``{"dispatch_fn": ..., "collect_fn": ...}`` for a registered mode."""
    spec = _lookup(dispatch_mode)
    return {"dispatch_fn": spec.dispatch_fn, "collect_fn": spec.collect_fn}


def _lookup(dispatch_mode: Dispatch) -> DispatchModeSpec:
    if not isinstance(dispatch_mode, Dispatch):
        raise DispatchModeTypeError(
            f"expected a Dispatch member, got {type(dispatch_mode).__qualname__} {dispatch_mode!r}"
        )
    spec = _registry.get(dispatch_mode)
    if spec is None:
        raise UnknownDispatchModeError(
            f"dispatch mode {dispatch_mode.name} has no dispatch/collect functions; "
            "register it with sc_dispatch.register_dispatch_mode"
        )
    return spec


def resolve_dispatch_mode(dispatch_mode: Dispatch | Mapping[str, Any]) -> DispatchModeSpec:
    """The :class:`DispatchModeSpec` of a registered mode or of a custom-mode mapping."""
    if isinstance(dispatch_mode, Dispatch):
        return _lookup(dispatch_mode)
    if isinstance(dispatch_mode, Mapping):
        missing = [k for k in ("dispatch_fn", "collect_fn") if k not in dispatch_mode]
        if missing:
            raise InvalidDispatchModeError(
                f"custom dispatch mode {dict(dispatch_mode)!r} lacks {missing}; "
                "give both 'dispatch_fn' and 'collect_fn'"
            )
        unknown = set(dispatch_mode) - {
            "dispatch_fn",
            "collect_fn",
            "unpad_output",
            "joins_shards",
            "name",
        }
        if unknown:
            raise InvalidDispatchModeError(
                f"custom dispatch mode has unknown keys {sorted(unknown)}; "
                "expected 'dispatch_fn' and 'collect_fn'"
            )
        name = str(
            dispatch_mode.get("name", getattr(dispatch_mode["dispatch_fn"], "__name__", "custom"))
        )
        return DispatchModeSpec(
            name,
            dispatch_mode["dispatch_fn"],
            dispatch_mode["collect_fn"],
            dispatch_mode.get("unpad_output", True),
            dispatch_mode.get("joins_shards", False),
        )
    raise DispatchModeTypeError(
        f"dispatch_mode must be a Dispatch member or a mapping with 'dispatch_fn' and "
        f"'collect_fn', got {type(dispatch_mode).__qualname__} {dispatch_mode!r}"
    )


def register_dispatch_mode(
    dispatch_mode_name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    *,
    unpad_output: bool = True,
    joins_shards: bool = False,
) -> Dispatch:
    """Add a new ``Dispatch`` member called ``dispatch_mode_name.upper()`` with its
    functions and return it.

    A name that is already a ``Dispatch`` member is a
    :class:`~sc_dispatch.DispatchModeExistsError` (use :func:`update_dispatch_mode` to change
    an existing mode).
    """
    if not isinstance(dispatch_mode_name, str):
        raise DispatchModeTypeError(
            f"register_dispatch_mode: the mode name must be a str, got "
            f"{type(dispatch_mode_name).__qualname__} {dispatch_mode_name!r}"
        )
    spec = DispatchModeSpec(
        dispatch_mode_name.upper(), dispatch_fn, collect_fn, unpad_output, joins_shards
    )
    with _lock:
        if dispatch_mode_name.upper() in Dispatch:
            raise DispatchModeExistsError(
                f"register_dispatch_mode: dispatch mode {dispatch_mode_name!r} already exists; "
                "use update_dispatch_mode to replace its functions"
            )
        member = Dispatch.register(dispatch_mode_name)
        _registry[member] = spec
    return member


def update_dispatch_mode(
    dispatch_mode: Dispatch,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn,
    *,
    unpad_output: bool | None = None,
    joins_shards: bool | None = None,
) -> None:
    """Replace the functions of an existing dispatch mode (a ``Dispatch`` member, else a
    :class:`~sc_dispatch.DispatchModeTypeError`); ``unpad_output`` and ``joins_shards``
    keep their values unless given."""
    with _lock:
        old = _lookup(dispatch_mode)
        _registry[dispatch_mode] = DispatchModeSpec(
            old.name,
            dispatch_fn,
            collect_fn,
            old.unpad_output if unpad_output is None else unpad_output,
            old.joins_shards if joins_shards is None else joins_shards,
        )


def get_predefined_execute_fn(execute_mode: Execute) -> ExecuteFnDict:
    """verl's lookup: the name of the worker-group method that runs a call."""
    if not isinstance(execute_mode, Execute):
        raise DispatchModeTypeError(
            f"expected an Execute member, got {type(execute_mode).__qualname__} {execute_mode!r}"
        )
    if execute_mode is Execute.ALL:
        return {"execute_fn_name": "execute_all"}
    if execute_mode is Execute.RANK_ZERO:
        return {"execute_fn_name": "execute_rank_zero"}
    raise UnknownDispatchModeError(
        f"execute mode {execute_mode!r} is not supported; use Execute.ALL or Execute.RANK_ZERO"
    )
