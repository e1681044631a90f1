"""A batch that several readers may share arrives as a private copy on each of them.

sc-ray puts a value that several ranks receive (a ``ONE_TO_ALL`` argument, the shard every
rank of an N-d dp group gets) into the object store once. A DataProto or TensorDict read
from the store aliases its memory (sc-protocol's zero-copy unpickling), and the ranks on
one node read the same bytes: a rank that writes into its batch in place, as verl's workers
may, would change its peers' batches. So such a value travels wrapped in
:class:`PrivateOnLoad`, whose unpickling copies the tensors into memory of the rank's own,
as verl's copies do. A value that one rank alone receives (a ``DP_COMPUTE_PROTO`` shard)
is not wrapped: it stays zero-copy, and no other rank reads it.

The result of a non-blocking call lives in the store for every reader of its future (the
ranks of the next group, the driver's ``get()``): a ``DataProtoFuture`` copies its value
itself, once, after slicing and joining the shards it needs, and a per-rank ``RayFuture``
applies :func:`private_copy` to its value. The outputs of a blocking call have one reader,
the driver, and stay zero-copy.
"""

from __future__ import annotations

import copy
from typing import Any

from ._wire import is_data_proto, is_tensordict

__all__ = ["PrivateOnLoad", "private_copy", "private_on_load"]


def private_copy(value: Any) -> Any:
    """``value`` with tensors of its own (numpy columns arrive read-only, so they stay)."""
    if is_tensordict(value):
        return value.clone()
    if is_data_proto(value):
        out = copy.copy(value)  # shares the columns: replace the tensors only
        if out.batch is not None:
            out.batch = out.batch.clone()
        return out
    return value


class PrivateOnLoad:
    """``value``, unpickled as a private copy (see the module doc)."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __reduce__(self) -> tuple[Any, tuple[Any]]:
        return (private_copy, (self.value,))


def private_on_load(value: Any) -> Any:
    """``value`` wrapped in :class:`PrivateOnLoad` if it is a DataProto or TensorDict (what
    unpickles as views of the object store), else ``value`` itself."""
    return PrivateOnLoad(value) if is_data_proto(value) or is_tensordict(value) else value
