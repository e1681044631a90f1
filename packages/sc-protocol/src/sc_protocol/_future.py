"""DataProtoFuture: the not-yet-available output of a non-blocking call, backend-neutral.

A future is a list of *shards* -- opaque handles (Ray ``ObjectRef``s, ``concurrent.futures``
futures, or plain DataProtos), one per producer rank -- plus a *resolver*, the function
the backend supplies to turn a list of handles into a list of DataProtos (``ray.get`` for
sc-ray; :mod:`._resolve` holds the default). When the row count of every shard is known, the
future keeps its *slices* (:mod:`._slices`): the ordered row ranges of the shards that make up its
value. ``chunk``, ``pad``, ``unpad`` and ``slice`` then only rewrite the slices, and each
resulting future holds just the shards it needs, so that a consumer fetches only those. When
some row count is unknown (``None``), the same operations are recorded (:mod:`._deferred`)
and applied after every shard has been fetched and joined, which is verl's behaviour.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Generic, cast

from tensordict import TensorDictBase
from typing_extensions import TypeVar

from ._columns import cat_tensordicts
from ._config import DataProtoConfig
from ._data_proto import DataProto
from ._deferred import Op, apply_op, op_rows
from ._errors import FutureError, InvalidSizeError, ProtocolTypeError, UnknownRowCountError
from ._resolve import Resolver, resolve_local
from ._slices import ShardSlice, check_count, chunk_bounds, count_rows, cut

__all__ = ["DataProtoFuture"]

#: What a future resolves to: a DataProto (the default), or a TensorDict when the workers
#: return TensorDicts (annotate ``DataProtoFuture[TensorDict]``).
B = TypeVar("B", bound="DataProto | TensorDictBase", default=DataProto)


def _rows(value: DataProto | TensorDictBase, start: int, stop: int) -> DataProto | TensorDictBase:
    return value.slice(start, stop) if isinstance(value, DataProto) else value[start:stop]


def _join(parts: Sequence[DataProto | TensorDictBase]) -> DataProto | TensorDictBase:
    """One batch from the shards, in order: ``DataProto.concat`` of DataProtos, the rows of
    TensorDicts joined into one TensorDict (verl's future joins either)."""
    if all(isinstance(p, DataProto) for p in parts):
        protos = [p for p in parts if isinstance(p, DataProto)]
        return protos[0] if len(protos) == 1 else DataProto.concat(protos)
    if all(isinstance(p, TensorDictBase) for p in parts):
        tds = [p for p in parts if isinstance(p, TensorDictBase)]
        return tds[0] if len(tds) == 1 else cat_tensordicts(tds)
    kinds = sorted({type(p).__name__ for p in parts})
    raise FutureError(f"DataProtoFuture: cannot join shards of different kinds {kinds}")


def _own(value: DataProto | TensorDictBase) -> DataProto | TensorDictBase:
    """``value`` with tensors of its own. A fetched shard may be shared with its other
    readers (Ray's object store hands each reader on a node the same memory), so a future's
    value never aliases one: a join of several pieces is new memory already, a single piece
    is cloned (numpy columns arrive read-only, so they are shared as they are)."""
    if isinstance(value, DataProto):
        batch = None if value.batch is None else value.batch.clone()
        return value._new(batch, dict(value.non_tensor_batch))
    return value.clone()


def _apply(op: Op, value: DataProto | TensorDictBase) -> DataProto | TensorDictBase:
    """A recorded row operation on the joined value (a TensorDict goes through a DataProto
    that holds it as its batch, and comes back out)."""
    if isinstance(value, DataProto):
        return apply_op(op, value)
    out = apply_op(op, DataProto(batch=value)).batch
    return out if out is not None else value[:0]


CollectFn = Callable[[list[Any]], Any]


class DataProtoFuture(Generic[B]):
    """A DataProto (or, when the workers return TensorDicts, a TensorDict) that a
    non-blocking call will produce.

    Build one with :meth:`from_shards` (``refs``, their ``row_counts`` -- ``None`` where
    unknown -- and the backend's ``resolve`` function), or, as in verl, with
    ``DataProtoFuture(collect_fn, futures, dispatch_fn)``. :meth:`get` fetches the needed
    shards and returns the DataProto; the value is cached.
    """

    def __init__(
        self,
        collect_fn: CollectFn | None = None,
        futures: Sequence[Any] | None = None,
        dispatch_fn: Callable[[DataProto], DataProto] | None = None,
        *,
        resolve: Resolver | None = None,
        row_counts: Sequence[int | None] | None = None,
    ) -> None:
        refs = tuple(futures or ())
        if collect_fn is not None and not callable(collect_fn):
            raise ProtocolTypeError(
                f"DataProtoFuture: collect_fn must be callable, got {collect_fn!r}"
            )
        if dispatch_fn is not None and not callable(dispatch_fn):
            raise ProtocolTypeError(
                f"DataProtoFuture: dispatch_fn must be callable, got {dispatch_fn!r}"
            )
        if resolve is not None and not callable(resolve):
            raise ProtocolTypeError(f"DataProtoFuture: resolve must be callable, got {resolve!r}")
        if row_counts is None:
            counts: tuple[int | None, ...] = (None,) * len(refs)
        else:
            counts = tuple(row_counts)
            if len(counts) != len(refs):
                raise FutureError(
                    f"DataProtoFuture: {len(refs)} shards but {len(counts)} row counts "
                    f"{list(counts)}"
                )
            for i, c in enumerate(counts):
                if c is not None:
                    check_count(c, f"DataProtoFuture: row_counts[{i}]")
        self._refs: tuple[Any, ...] = refs
        self._counts = counts
        self._resolve: Resolver | None = resolve
        self._collect_fn: CollectFn | None = collect_fn
        self._children: tuple[DataProtoFuture[B], ...] | None = None
        self._ops: tuple[Op, ...] = ()
        self._slices: tuple[ShardSlice, ...] | None = None
        self._value: B | None = None
        if dispatch_fn is not None:
            self._ops = (("fn", dispatch_fn, None),)
        elif collect_fn is None and all(c is not None for c in counts):
            slices: list[ShardSlice] = []
            for i, c in enumerate(counts):
                if c:
                    slices.append(ShardSlice(i, 0, int(c)))
            if not slices and refs:
                slices.append(ShardSlice(0, 0, 0))
            self._slices = tuple(slices)

    # -- construction ---------------------------------------------------------------------

    @classmethod
    def from_shards(
        cls,
        refs: Sequence[Any],
        row_counts: Sequence[int | None] | None = None,
        resolve: Resolver | None = None,
    ) -> DataProtoFuture[Any]:
        """A future joining ``refs`` in order; ``row_counts[i]`` is the rows of shard ``i``
        (``None`` if unknown); ``resolve(list_of_refs)`` returns their DataProtos (or
        TensorDicts). Annotate what it resolves to: ``DataProtoFuture`` (DataProtos) or
        ``DataProtoFuture[TensorDict]``."""
        return cls(futures=refs, resolve=resolve, row_counts=row_counts)

    @classmethod
    def from_value(cls, data: DataProto) -> DataProtoFuture[DataProto]:
        """A future that is already resolved (for in-process backends and tests)."""
        if not isinstance(data, DataProto):
            raise ProtocolTypeError(
                f"DataProtoFuture.from_value: expected a DataProto, got {type(data).__name__}"
            )
        return cast("DataProtoFuture[DataProto]", cls(futures=[data], row_counts=[len(data)]))

    def _derive(self) -> DataProtoFuture[B]:
        new = DataProtoFuture.__new__(DataProtoFuture)
        new.__dict__.update(self.__dict__)
        new._value = None
        return new

    # -- accessors ------------------------------------------------------------------------

    @property
    def shard_refs(self) -> tuple[Any, ...]:
        """The shard handles this future needs (after chunking: only the overlapping ones)."""
        if self._children is not None:
            refs: list[Any] = []
            for child in self._children:
                refs.extend(r for r in child.shard_refs if not any(r is x for x in refs))
            return tuple(refs)
        return self._refs

    @property
    def row_counts(self) -> tuple[int | None, ...]:
        """The row count of each shard in :attr:`shard_refs` (``None`` where unknown)."""
        if self._children is not None:
            refs: list[Any] = []
            counts: list[int | None] = []
            for child in self._children:
                for r, c in zip(child.shard_refs, child.row_counts, strict=True):
                    if not any(r is x for x in refs):
                        refs.append(r)
                        counts.append(c)
            return tuple(counts)
        return self._counts

    @property
    def slices(self) -> tuple[ShardSlice, ...] | None:
        """How the value is built from :attr:`shard_refs`: row ranges in order, or ``None``
        when some row count is unknown (then every shard is fetched and joined)."""
        return self._slices

    @property
    def num_rows(self) -> int | None:
        """Rows of the value, or ``None`` if it is not known before resolving."""
        if self._slices is not None:
            return count_rows(self._slices)
        if self._children is not None:
            counts = [c.num_rows for c in self._children]
            base = (
                None if any(c is None for c in counts) else sum(c for c in counts if c is not None)
            )
        elif self._collect_fn is None and all(c is not None for c in self._counts):
            base = sum(c for c in self._counts if c is not None)
        else:
            base = None
        for op in self._ops:
            if base is None:
                return None
            base = op_rows(op, base)
        return base

    def __len__(self) -> int:
        rows = self.num_rows
        if rows is None:
            raise UnknownRowCountError(
                "DataProtoFuture: the row count is unknown "
                f"(shard row counts {list(self.row_counts)})"
            )
        return rows

    def __bool__(self) -> bool:
        return True

    def __repr__(self) -> str:
        return (
            f"DataProtoFuture(shards={len(self.shard_refs)}, row_counts={list(self.row_counts)}, "
            f"rows={self.num_rows})"
        )

    # verl's attribute names
    @property
    def futures(self) -> list[Any]:
        """verl's name for :attr:`shard_refs`."""
        return list(self.shard_refs)

    @property
    def collect_fn(self) -> CollectFn:
        """The function that joins the resolved shards (``DataProto.concat`` by default)."""
        return self._collect_fn or _join

    # -- lazy row operations ----------------------------------------------------------------

    def shard_slices(self, start: int, stop: int) -> list[ShardSlice]:
        """Rows ``start:stop`` of this future's value, as pieces of :attr:`shard_refs`.

        Needs known row counts (raises :class:`UnknownRowCountError` otherwise).
        """
        if self._slices is None:
            raise UnknownRowCountError(
                "DataProtoFuture.shard_slices: the shard row counts are not all known "
                f"({list(self.row_counts)})"
            )
        total = count_rows(self._slices)
        if not (0 <= start <= stop <= total):
            raise InvalidSizeError(
                f"DataProtoFuture.shard_slices: row range {start}:{stop} is not within {total} rows"
            )
        return [p for p in cut(self._slices, start, stop) if p.stop > p.start]

    def _with_slices(self, slices: Sequence[ShardSlice]) -> DataProtoFuture[B]:
        used = sorted({p.shard for p in slices})
        remap = {old: new for new, old in enumerate(used)}
        new = self._derive()
        new._refs = tuple(self._refs[i] for i in used)
        new._counts = tuple(self._counts[i] for i in used)
        new._slices = tuple(ShardSlice(remap[p.shard], p.start, p.stop) for p in slices)
        return new

    def _with_op(self, op: Op) -> DataProtoFuture[B]:
        new = self._derive()
        new._ops = (*self._ops, op)
        return new

    def slice(self, start: int, stop: int) -> DataProtoFuture[B]:
        """Rows ``start:stop`` of the value (a new future; nothing is fetched)."""
        check_count(start, "DataProtoFuture.slice: start")
        check_count(stop, "DataProtoFuture.slice: stop")
        if start > stop:
            raise InvalidSizeError(f"DataProtoFuture.slice: start {start} > stop {stop}")
        if self._slices is not None:
            total = count_rows(self._slices)
            if stop > total:
                raise InvalidSizeError(
                    f"DataProtoFuture.slice: row range {start}:{stop} is not within {total} rows"
                )
            return self._with_slices(cut(self._slices, start, stop))
        return self._with_op(("slice", start, stop))

    def chunk(self, chunks: int) -> list[DataProtoFuture[B]]:
        """Split into exactly ``chunks`` futures (``numpy.array_split`` sizes) without
        fetching anything; with known row counts each part holds only its shards."""
        if isinstance(chunks, bool) or not isinstance(chunks, int):
            raise ProtocolTypeError(f"DataProtoFuture.chunk: chunks must be an int, got {chunks!r}")
        if chunks < 1:
            raise InvalidSizeError(f"DataProtoFuture.chunk: chunks must be >= 1, got {chunks}")
        if self._slices is not None:
            total = count_rows(self._slices)
            if chunks > total and not DataProtoConfig.auto_padding:
                raise InvalidSizeError(
                    f"DataProtoFuture.chunk: cannot split {total} rows into {chunks} chunks"
                )
            return [
                self._with_slices(cut(self._slices, a, b)) for a, b in chunk_bounds(total, chunks)
            ]
        return [self._with_op(("chunk", i, chunks)) for i in range(chunks)]

    def pad(self, pad_size: int) -> DataProtoFuture[B]:
        """Append ``pad_size`` rows repeated from the start (cycling), lazily."""
        check_count(pad_size, "DataProtoFuture.pad: pad_size")
        if pad_size == 0:
            return self
        if self._slices is not None:
            total = count_rows(self._slices)
            if total == 0:
                raise InvalidSizeError(
                    f"DataProtoFuture.pad: cannot pad an empty batch with {pad_size} rows"
                )
            full, rest = divmod(pad_size, total)
            slices = list(self._slices) * (1 + full) + cut(self._slices, 0, rest)
            return self._with_slices([p for p in slices if p.stop > p.start])
        return self._with_op(("pad", pad_size, None))

    def unpad(self, pad_size: int) -> DataProtoFuture[B]:
        """Drop the last ``pad_size`` rows, lazily (``get()`` never returns them)."""
        check_count(pad_size, "DataProtoFuture.unpad: pad_size")
        if pad_size == 0:
            return self
        if self._slices is not None:
            total = count_rows(self._slices)
            if pad_size > total:
                raise InvalidSizeError(
                    f"DataProtoFuture.unpad: cannot drop {pad_size} rows from {total}"
                )
            return self._with_slices(cut(self._slices, 0, total - pad_size))
        return self._with_op(("unpad", pad_size, None))

    @staticmethod
    def concat(data: Sequence[Any]) -> DataProtoFuture[Any]:
        """Join futures into one (rows in order). Futures with known row counts and the same
        resolver merge into one list of slices; raw shard handles (verl's call) become one
        future."""
        parts = list(data)
        if not parts:
            raise InvalidSizeError("DataProtoFuture.concat: nothing to concatenate (empty list)")
        if not all(isinstance(p, DataProtoFuture) for p in parts):
            if any(isinstance(p, DataProtoFuture) for p in parts):
                raise ProtocolTypeError(
                    "DataProtoFuture.concat: mix of DataProtoFutures and raw shard handles"
                )
            return DataProtoFuture(futures=parts)
        futures: list[DataProtoFuture[Any]] = parts
        if len(futures) == 1:
            return futures[0]
        first = futures[0]
        if all(f._slices is not None and f._resolve == first._resolve for f in futures):
            refs: list[Any] = []
            counts: list[int | None] = []
            slices: list[ShardSlice] = []
            for f in futures:
                index_of: dict[int, int] = {}
                for i, ref in enumerate(f._refs):
                    found = next((j for j, r in enumerate(refs) if r is ref), None)
                    if found is None:
                        refs.append(ref)
                        counts.append(f._counts[i])
                        found = len(refs) - 1
                    index_of[i] = found
                slices.extend(
                    ShardSlice(index_of[p.shard], p.start, p.stop) for p in f._slices or ()
                )
            merged = DataProtoFuture(futures=refs, resolve=first._resolve, row_counts=counts)
            non_empty = [p for p in slices if p.stop > p.start]
            merged._slices = tuple(non_empty or slices[:1])
            return merged
        out = DataProtoFuture()
        out._children = tuple(futures)
        out._slices = None
        return out

    # -- resolution -------------------------------------------------------------------------

    def _fetch(self) -> list[DataProto | TensorDictBase]:
        refs = list(self._refs)
        resolve = self._resolve or resolve_local
        values = list(resolve(refs))
        if len(values) != len(refs):
            raise FutureError(
                f"DataProtoFuture: the resolver returned {len(values)} values for "
                f"{len(refs)} shards"
            )
        for i, (value, count) in enumerate(zip(values, self._counts, strict=True)):
            if not isinstance(value, (DataProto, TensorDictBase)):
                if self._collect_fn is not None:
                    continue  # a custom collect_fn takes whatever the workers returned
                raise FutureError(
                    f"DataProtoFuture: shard {i} resolved to a {type(value).__name__}, "
                    "not a DataProto or a TensorDict"
                )
            if count is not None and len(value) != count:
                raise FutureError(
                    f"DataProtoFuture: shard {i} has {len(value)} rows, {count} were announced"
                )
        return values

    def get(self) -> B:
        """Fetch the needed shards and return their rows joined (cached after the first
        call): a DataProto when the workers returned DataProtos, a TensorDict when they
        returned TensorDicts (as verl's future does); shards of both kinds are a
        :class:`~sc_protocol.FutureError`. The value's tensors are its own, never a view
        of a fetched shard that other readers share."""
        if self._value is not None:
            return self._value
        if self._slices is not None:
            values = self._fetch()
            pieces = []
            for p in self._slices:
                shard = values[p.shard]
                whole = p.start == 0 and p.stop == len(shard)
                pieces.append(shard if whole else _rows(shard, p.start, p.stop))
            value = _join(pieces) if len(pieces) > 1 else _own(pieces[0]) if pieces else DataProto()
        else:
            if self._children is not None:
                value = _join([c.get() for c in self._children])
            elif not self._refs:
                value = DataProto()
            else:
                value = self.collect_fn(self._fetch())
                if not isinstance(value, (DataProto, TensorDictBase)):
                    raise FutureError(
                        f"DataProtoFuture: collect_fn returned a {type(value).__name__}, "
                        "not a DataProto or a TensorDict"
                    )
                if len(self._refs) == 1:  # the join may be the shard itself
                    value = _own(value)
            for op in self._ops:
                value = _apply(op, value)
        self._value = cast(B, value)
        return self._value

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_value"] = None  # never ship a fetched value along with the handles
        return state
