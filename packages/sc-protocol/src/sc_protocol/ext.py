"""sc-protocol's extender tier: what a backend or a dispatch mode needs beyond DataProto.

A user of DataProto needs none of it (:mod:`sc_protocol`).

* The shard adapters through which sc-dispatch splits, joins, pads and sizes a
  :class:`~sc_protocol.DataProto` (:class:`DataProtoAdapter`), a TensorDict
  (:class:`TensorDictAdapter`) and a :class:`~sc_protocol.DataProtoFuture`
  (:class:`DataProtoFutureAdapter`); :func:`register_adapters` registers them, which
  importing :mod:`sc_protocol` does.
* Futures: a future's value is the concatenation of its shard slices, a list of :class:`ShardSlice`
  (:func:`slice_shards`); a backend whose shard handles are its own type registers a
  :data:`Resolver` for them with ``sc_dispatch.ext.register_future_resolver``.
* Moving a TensorDict without copies: :func:`tensordict_state` and
  :func:`rebuild_tensordict`, the pickled state of its tensors (sc-ray's wire format uses
  them).
"""

from sc_dispatch import _public

from ._adapters import (
    DataProtoAdapter,
    DataProtoFutureAdapter,
    TensorDictAdapter,
    register_adapters,
)
from ._resolve import Resolver
from ._serialize import rebuild_tensordict, tensordict_state
from ._slices import ShardSlice, slice_shards

__all__ = [
    "DataProtoAdapter",
    "DataProtoFutureAdapter",
    "Resolver",
    "ShardSlice",
    "TensorDictAdapter",
    "rebuild_tensordict",
    "register_adapters",
    "slice_shards",
    "tensordict_state",
]

_public.publish(globals())
