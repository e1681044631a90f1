"""The predefined dispatch and collect functions of verl's modes (``RANK_ZERO``,
``ONE_TO_ALL``, ``ALL_TO_ALL``, ``DP_COMPUTE``, ``DP_COMPUTE_PROTO`` and its ``_WITH_FUNC``
and ``_METRIC`` variants, ``DIRECT_ROLLOUT_METHOD``); :mod:`._registry` installs them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._errors import DirectRolloutCallError, DispatchArgumentError, NotShardableError
from ._protocols import DispatchWorkerGroup
from ._shard import PADDING_SIZE_KEY, _describe, concat_outputs, split_args_kwargs


def _world_size(worker_group: Any, mode: str) -> int:
    size = getattr(worker_group, "world_size", None)
    if not isinstance(size, int) or size < 1:
        raise DispatchArgumentError(
            f"{mode}: worker group {worker_group!r} has no positive integer world_size "
            f"(got {size!r})"
        )
    return size


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
