"""Turning shard handles into DataProtos: the default resolver of a DataProtoFuture.

A backend that makes its own handle type registers a resolver for it with
:func:`sc_dispatch.ext.register_future_resolver` (sc-ray does so for Ray object references);
:func:`resolve_local` groups the handles of a future by their resolver and calls each once,
in bulk.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Callable, Sequence
from typing import Any

from sc_dispatch.ext import get_future_resolver
from tensordict import TensorDictBase

from ._data_proto import DataProto
from ._errors import FutureError

__all__ = ["Resolver", "resolve_local"]

#: Turns a list of shard handles into the list of their DataProtos (e.g. ``ray.get``);
#: resolvers for a backend's handle type are registered with
#: :func:`sc_dispatch.ext.register_future_resolver`.
Resolver = Callable[[list[Any]], Sequence[Any]]


def resolve_local(refs: list[Any]) -> list[Any]:
    """Default resolver: DataProtos and TensorDicts as they are, handles of a registered
    type through their resolver (one call per type, in bulk), ``concurrent.futures``
    futures by ``result()``, and any other future by ``get()``."""
    out: list[Any] = [None] * len(refs)
    grouped: dict[Resolver, list[int]] = {}
    for i, ref in enumerate(refs):
        if isinstance(ref, (DataProto, TensorDictBase)):
            out[i] = ref
        elif (resolver := get_future_resolver(ref)) is not None:
            grouped.setdefault(resolver, []).append(i)
        elif isinstance(ref, concurrent.futures.Future):
            out[i] = ref.result()
        elif callable(getattr(ref, "get", None)):
            out[i] = ref.get()
        else:
            raise FutureError(
                f"DataProtoFuture: shard {i} is a {type(ref).__name__}, which no resolver "
                "handles; import the backend that made it (sc_ray registers Ray object "
                "references), pass resolve=, or register_future_resolver(its type, ...)"
            )
    for resolver, positions in grouped.items():
        values = list(resolver([refs[i] for i in positions]))
        if len(values) != len(positions):
            raise FutureError(
                f"DataProtoFuture: a resolver returned {len(values)} values for "
                f"{len(positions)} shards"
            )
        for i, value in zip(positions, values, strict=True):
            out[i] = value
    return out
