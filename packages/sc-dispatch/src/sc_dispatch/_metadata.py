"""Metadata-only shards: what a rank that does not read the batch receives.

A rank registered on a mesh with ``receives_data=False`` (a middle pipeline stage, which
gets its activations from the previous stage) still runs the method on its dp group's
shard, but needs only the shard's row count and batch-level metadata. The shard adapter of
a type says how to make that form: an optional ``metadata_only(obj)`` that returns an
object of the same length holding no row data (sc-protocol's DataProto adapter returns a
DataProto with the same ``meta_info``, a TensorDict of ``batch_size [n]`` and no keys, and
no numpy columns). A value whose adapter has no such method -- a plain ``Rows`` list, a
TensorDict, a future whose rows are not fetched yet, any argument that is not a batch --
reaches those ranks unchanged.
"""

from __future__ import annotations

from typing import Any

from ._errors import DispatchArgumentError
from ._shard import get_shard_adapter

__all__ = ["MetadataCache", "metadata_arguments", "metadata_only"]

#: The metadata-only forms made for one call, by argument (position or keyword) and row
#: count: the shards of one batch share their metadata, so the ranks that do not read the
#: batch share one small object per argument and row count (a backend sends it once).
MetadataCache = dict[tuple[int | str, int], Any]


def metadata_only(mode: str, value: Any) -> Any | None:
    """``value``'s metadata-only form (its adapter's ``metadata_only``), or ``None`` when its
    type has none. The form must have ``value``'s row count: anything else is a
    :class:`~sc_dispatch.DispatchArgumentError` naming the mode and the type."""
    adapter = get_shard_adapter(value)
    strip = getattr(adapter, "metadata_only", None)
    if adapter is None or strip is None:
        return None
    out = strip(value)
    expected = adapter.length(value)
    out_adapter = get_shard_adapter(out)
    got = None if out_adapter is None else out_adapter.length(out)
    if got != expected:
        raise DispatchArgumentError(
            f"{mode}: the metadata_only form of a {type(value).__qualname__} of {expected} rows "
            f"is a {type(out).__qualname__} of {got} rows; it must keep the row count"
        )
    return out


def metadata_arguments(
    mode: str, args: tuple[Any, ...], kwargs: dict[str, Any], cache: MetadataCache
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` as a rank that does not read the batch receives them: every
    value that has a metadata-only form replaced by it (made once per argument and row count
    and kept in ``cache``), every other value unchanged."""

    def strip(key: int | str, value: Any) -> Any:
        adapter = get_shard_adapter(value)
        if adapter is None or getattr(adapter, "metadata_only", None) is None:
            return value
        length = adapter.length(value)
        if length is None:  # not known yet (a future): its metadata is not known either
            return value
        found = cache.get((key, length))
        if found is None:
            found = metadata_only(mode, value)
            cache[(key, length)] = found
        return found

    return (
        tuple(strip(i, a) for i, a in enumerate(args)),
        {k: strip(k, v) for k, v in kwargs.items()},
    )
