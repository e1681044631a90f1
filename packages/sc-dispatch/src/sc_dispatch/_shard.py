"""The shardable-container registry and the splitting helpers every splitting mode uses."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ._errors import DispatchArgumentError, NotShardableError
from ._protocols import ShardAdapter

__all__ = [
    "PADDING_SIZE_KEY",
    "Resolver",
    "adapter_for_class",
    "Rows",
    "chunk_sizes",
    "concat_outputs",
    "get_future_resolver",
    "get_shard_adapter",
    "is_future",
    "is_shardable",
    "per_rank_arguments",
    "pop_padding_size",
    "register_future_resolver",
    "register_future_type",
    "register_shardable",
    "split_args_kwargs",
    "unpad_output",
]

T = TypeVar("T")

_lock = threading.Lock()
_adapters: dict[type, ShardAdapter[Any]] = {}
_future_types: tuple[type, ...] = ()


def chunk_sizes(length: int, chunks: int) -> list[int]:
    """Sizes of ``chunks`` parts of ``length`` rows, earlier parts one longer if uneven."""
    base, extra = divmod(length, chunks)
    return [base + 1 if i < extra else base for i in range(chunks)]


class _SequenceAdapter:
    """Lists and tuples: split into contiguous slices, joined by concatenation.

    Padding repeats rows from the start (cycling if the pad is longer than the sequence),
    like DataProto's padding; plain sequences only pad when a mode pads other arguments of
    the same call.
    """

    def __init__(self, kind: Callable[[list[Any]], Sequence[Any]]) -> None:
        self._kind = kind

    def length(self, obj: Sequence[Any]) -> int:
        return len(obj)

    def chunk(self, obj: Sequence[Any], chunks: int) -> list[Sequence[Any]]:
        parts: list[Sequence[Any]] = []
        start = 0
        for size in chunk_sizes(len(obj), chunks):
            parts.append(self._kind(list(obj[start : start + size])))
            start += size
        return parts

    def concat(self, parts: Sequence[Sequence[Any]]) -> Sequence[Any]:
        out: list[Any] = []
        for part in parts:
            out.extend(part)
        return self._kind(out)

    def pad(self, obj: Sequence[Any], pad_size: int) -> Sequence[Any]:
        if pad_size == 0:
            return obj
        if len(obj) == 0:
            raise DispatchArgumentError("cannot pad an empty sequence")
        extra = [obj[i % len(obj)] for i in range(pad_size)]
        return self._kind([*obj, *extra])

    def unpad(self, obj: Sequence[Any], pad_size: int) -> Sequence[Any]:
        return self._kind(list(obj[: len(obj) - pad_size])) if pad_size else obj

    def take(self, obj: Sequence[Any], positions: Sequence[int]) -> Sequence[Any]:
        return self._kind([obj[i] for i in positions])

    def auto_padding(self, obj: Sequence[Any]) -> bool:
        return False


class Rows(list):  # type: ignore[type-arg]  # a list of anything, like ``list`` itself
    """A batch of rows for sc-dispatch users without DataProto: a ``list`` that splitting modes
    (``DP_COMPUTE_PROTO``, N-d mesh modes) split into contiguous shards and join back.

    Plain lists and tuples are per-rank arguments (``DP_COMPUTE``); wrap the rows,
    ``Rows(items)``, to say they are one batch to split. Shards and joined outputs are
    ``Rows`` again.
    """

    def __repr__(self) -> str:
        return f"Rows({list.__repr__(self)})"


def register_shardable(cls: type[T], adapter: ShardAdapter[T]) -> None:
    """Teach the splitting modes to split, join and pad instances of ``cls`` (and subclasses).

    Registering a type again replaces its adapter.
    """
    if not isinstance(cls, type):
        raise NotShardableError(f"register_shardable: expected a class, got {cls!r}")
    with _lock:
        _adapters[cls] = adapter


def get_shard_adapter(obj: object) -> ShardAdapter[Any] | None:
    """The adapter registered for ``type(obj)`` or its nearest base class, or ``None``."""
    for klass in type(obj).__mro__:
        adapter = _adapters.get(klass)
        if adapter is not None:
            return adapter
    return None


def adapter_for_class(klass: type) -> ShardAdapter[Any] | None:
    """The adapter registered for exactly ``klass`` (no base-class lookup), or ``None``."""
    return _adapters.get(klass)


def is_shardable(obj: object) -> bool:
    """Whether a splitting mode can split ``obj``."""
    return get_shard_adapter(obj) is not None


def register_future_type(cls: type) -> None:
    """Mark ``cls`` as a future that ``@register(materialize_futures=True)`` resolves."""
    global _future_types
    if not isinstance(cls, type):
        raise NotShardableError(f"register_future_type: expected a class, got {cls!r}")
    with _lock:
        if cls not in _future_types:
            _future_types = (*_future_types, cls)


def is_future(obj: object) -> bool:
    """Whether ``obj`` is an instance of a registered future type."""
    return bool(_future_types) and isinstance(obj, _future_types)


#: Fetches the values behind a list of a backend's handles, in order.
Resolver = Callable[[list[Any]], Sequence[Any]]
_resolvers: dict[type, Resolver] = {}


def register_future_resolver(ref_type: type, resolve: Resolver) -> None:
    """Teach sc's futures to fetch handles of ``ref_type`` (and its subclasses):
    ``resolve(list_of_handles)`` returns their values, in order, in one bulk call. A backend
    registers its handle type when it is imported -- sc-ray registers ``ray.ObjectRef`` --
    so that ``sc_protocol.DataProtoFuture(futures=[ref, ...])`` needs no ``resolve=``
    argument, as in verl. Registering a type again replaces its resolver."""
    if not isinstance(ref_type, type):
        raise NotShardableError(
            f"register_future_resolver: expected a class, got {type(ref_type).__qualname__}"
        )
    if not callable(resolve):
        raise NotShardableError(
            f"register_future_resolver: resolve must be callable, got {resolve!r}"
        )
    with _lock:
        _resolvers[ref_type] = resolve


def get_future_resolver(ref: object) -> Resolver | None:
    """The resolver registered for ``type(ref)`` or its nearest base class, or ``None``."""
    for klass in type(ref).__mro__:
        found = _resolvers.get(klass)
        if found is not None:
            return found
    return None


def _describe(obj: object) -> str:
    text = repr(obj)
    return text if len(text) <= 80 else text[:77] + "..."


def _chunked(
    mode: str, adapter: ShardAdapter[Any], value: Any, chunks: int, what: str
) -> list[Any]:
    """``adapter.chunk(value, chunks)`` as a list; an adapter that returns another number of
    parts is a :class:`DispatchArgumentError` (``what``: the parts, as its message names them)."""
    parts = adapter.chunk(value, chunks)
    if len(parts) != chunks:
        raise DispatchArgumentError(
            f"{mode}: adapter for {type(value).__qualname__} returned {len(parts)} {what}, "
            f"expected {chunks}"
        )
    return list(parts)


def split_args_kwargs(
    mode: str,
    chunks: int,
    args: Sequence[Any],
    kwargs: dict[str, Any],
    *,
    allow_padding: bool = True,
    allow_sequences: bool = False,
) -> tuple[list[list[Any]], dict[str, list[Any]], int]:
    """Split every argument into ``chunks`` shards.

    Returns per-argument shard lists and the number of padding rows added at the end of the
    batch (0 when none). All arguments must be shardable batches (DataProto, TensorDict,
    futures, or any type with a registered adapter) of the same length (an adapter reports
    ``None`` for a future whose row count is not known yet). Plain lists and tuples are
    per-rank arguments that belong to ``DP_COMPUTE``: they are a
    :class:`~sc_dispatch.NotShardableError` here unless ``allow_sequences``.

    Splitting is exact: a length that does not divide by ``chunks`` is a
    :class:`~sc_dispatch.DispatchArgumentError` naming both, unless an argument has
    auto-padding enabled; then every argument is padded (on a new object) to the next
    multiple of ``chunks``.
    """
    named: list[tuple[str, Any]] = [(f"positional argument {i}", a) for i, a in enumerate(args)]
    named += [(f"keyword argument {k!r}", v) for k, v in kwargs.items()]
    if not named:
        return [], {}, 0
    adapters: list[ShardAdapter[Any]] = []
    lengths: list[int | None] = []
    for label, value in named:
        if not allow_sequences and type(value) in (list, tuple):
            raise NotShardableError(
                f"{mode}: {label} is a {type(value).__qualname__} ({_describe(value)}); this "
                "mode splits batches (DataProto, TensorDict, futures), not plain sequences: "
                "use Dispatch.DP_COMPUTE for per-rank lists, or wrap the rows in a DataProto "
                "(or sc_dispatch.Rows)"
            )
        adapter = get_shard_adapter(value)
        if adapter is None:
            raise NotShardableError(
                f"{mode}: {label} of type {type(value).__qualname__} cannot be split across "
                f"{chunks} workers ({_describe(value)}); pass a DataProto or TensorDict, "
                "or register an adapter with sc_dispatch.ext.register_shardable"
            )
        adapters.append(adapter)
        lengths.append(adapter.length(value))
    known = {n for n in lengths if n is not None}
    if len(known) > 1:
        detail = ", ".join(f"{label}: {n}" for (label, _), n in zip(named, lengths, strict=True))
        raise DispatchArgumentError(
            f"{mode}: all split arguments must have the same length, got {detail}"
        )
    # A future whose row count is not known yet reports the length None: it is split lazily
    # and padded like the arguments whose length is known.
    length = known.pop() if known else None
    pad_size = 0
    if length is None:
        pass
    elif length == 0:
        # Checked before divisibility: 0 rows divide evenly, yet no adapter may be asked
        # for more shards than rows.
        raise DispatchArgumentError(
            f"{mode}: cannot split an empty batch (0 rows) into {chunks} shards"
        )
    elif length % chunks:
        wants_padding = allow_padding and any(
            a.auto_padding(v) for a, (_, v) in zip(adapters, named, strict=True)
        )
        if not wants_padding:
            raise DispatchArgumentError(
                f"{mode}: a batch of {length} rows does not divide evenly into {chunks} shards "
                f"({length} % {chunks} = {length % chunks}); uneven shards would change each "
                "rank's batch size and loss weighting. Send a multiple of the shard count, or "
                "enable auto-padding (DataProtoConfig.auto_padding = True, "
                "SC_PROTOCOL_AUTO_PADDING=1, or DataProto.from_dict(..., auto_padding=True))"
            )
        pad_size = chunks - length % chunks
    split: list[list[Any]] = []
    for adapter, (_, value) in zip(adapters, named, strict=True):
        padded = adapter.pad(value, pad_size) if pad_size else value
        split.append(_chunked(mode, adapter, padded, chunks, "shards"))
    n_pos = len(args)
    return split[:n_pos], dict(zip(kwargs, split[n_pos:], strict=True)), pad_size


#: Keyword under which a splitting dispatch function reports the padding rows it added.
PADDING_SIZE_KEY = "_sc_padding_size"


def pop_padding_size(kwargs: dict[str, Any]) -> int:
    """Remove and return the padding size a dispatch function recorded (0 when none)."""
    value = kwargs.pop(PADDING_SIZE_KEY, 0)
    return int(value)


def concat_outputs(mode: str, output: Sequence[Any]) -> Any:
    """Concatenate shard outputs (one type) with the adapter of their type."""
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


def per_rank_arguments(
    world_size: int, args: Sequence[Any], kwargs: dict[str, Any]
) -> list[tuple[tuple[Any, ...], dict[str, Any]]]:
    """verl's ``execute_all`` rule: when every argument is a list of ``world_size`` entries,
    rank ``i`` gets entry ``i`` of each; otherwise every rank gets all the arguments."""
    values = (*args, *kwargs.values())
    if all(isinstance(v, list) and len(v) == world_size for v in values):
        return [
            (tuple(a[i] for a in args), {k: v[i] for k, v in kwargs.items()})
            for i in range(world_size)
        ]
    whole = (tuple(args), dict(kwargs))
    return [whole] * world_size


def unpad_output(output: Any, pad_size: int) -> Any:
    """Drop the ``pad_size`` padding rows from a collected output (no-op when 0)."""
    if not pad_size:
        return output
    adapter = get_shard_adapter(output)
    if adapter is None:
        return output
    return adapter.unpad(output, pad_size)


register_shardable(list, _SequenceAdapter(list))
register_shardable(tuple, _SequenceAdapter(tuple))
register_shardable(Rows, _SequenceAdapter(Rows))
