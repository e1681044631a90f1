"""sc-dispatch's extender tier: the parts a worker group, a container or a mode is made of.

For people who write a worker group or RPC layer (sc-core's groups use exactly this), teach
sc-dispatch a container type or a future type, or build a dispatch mode from parts. A user of
worker groups needs none of it: :mod:`sc_dispatch` holds ``register``, the modes and the
errors.

* Running a call: :func:`resolve_dispatch_mode` turns a method's mode into a
  :class:`DispatchModeSpec` (dispatch, plan, collect, padding); :func:`get_register_attrs`
  reads what ``@register`` stored (under :data:`MAGIC_ATTR`); :func:`materialize` resolves
  futures among the arguments; :data:`PADDING_SIZE_KEY` / :func:`pop_padding_size` and
  :func:`unpad_output` handle the rows a splitting mode padded.
* What a worker group must offer: the :class:`DispatchWorkerGroup` protocol
  (``world_size``, the mesh queries), and :func:`mesh_layout` to ask it a mesh's layout.
* Containers and futures: :func:`register_shardable` with a :class:`ShardAdapter` (or a
  :class:`SizedShardAdapter`, which also knows its bytes), :func:`get_shard_adapter`,
  :func:`is_shardable`, :func:`split_args_kwargs`, :func:`chunk_sizes`;
  :func:`register_future_type`, :func:`is_future`, :func:`register_future_resolver` /
  :func:`get_future_resolver` (a :data:`Resolver`) and the :class:`FutureLike` protocol.
* Payload sizes: :func:`payload_nbytes`, :func:`register_nbytes` (an :data:`NbytesFn`),
  :func:`get_nbytes_fn`.
* Work plans, the form every mode's split can take: :class:`WorkPlan` of
  :class:`WorkUnit` s on :class:`Slot` s, made by a :class:`PlanFn` such as
  :func:`even_plan` or :func:`balanced_plan` over :func:`rank_slots` / :func:`mesh_slots`;
  :class:`KeyRouter`, the sticky router.
* The shapes of modes: :data:`DispatchFn`, :data:`CollectFn`,
  :class:`DispatchAwareCollectFn` (given :data:`Dispatched`), :class:`ExecuteFnDict`, and
  the mappings the factories return (:class:`MeshDispatchFnDict`, named by a
  :data:`MeshModeName`; :class:`PlannedDispatchFnDict`).
"""

from . import _public
from ._modes import KeyRouter, PlannedDispatchFnDict
from ._nbytes import NbytesFn, get_nbytes_fn, payload_nbytes, register_nbytes
from ._nd import MeshDispatchFnDict, MeshModeName, mesh_layout
from ._plan import (
    DEFAULT_UNITS_PER_SLOT,
    PlanFn,
    Slot,
    WorkPlan,
    WorkUnit,
    balanced_plan,
    even_plan,
    mesh_slots,
    rank_slots,
)
from ._protocols import DispatchWorkerGroup, FutureLike, ShardAdapter, SizedShardAdapter
from ._register import MAGIC_ATTR, RegisterAttrs, get_register_attrs, materialize
from ._registry import resolve_dispatch_mode
from ._shard import (
    Resolver,
    chunk_sizes,
    get_future_resolver,
    get_shard_adapter,
    is_future,
    is_shardable,
    register_future_resolver,
    register_future_type,
    register_shardable,
    split_args_kwargs,
    unpad_output,
)
from ._spec import (
    PADDING_SIZE_KEY,
    CollectFn,
    DispatchAwareCollectFn,
    Dispatched,
    DispatchFn,
    DispatchModeSpec,
    ExecuteFnDict,
    pop_padding_size,
)

__all__ = [
    "CollectFn",
    "DEFAULT_UNITS_PER_SLOT",
    "DispatchAwareCollectFn",
    "DispatchFn",
    "DispatchModeSpec",
    "DispatchWorkerGroup",
    "Dispatched",
    "ExecuteFnDict",
    "FutureLike",
    "KeyRouter",
    "MAGIC_ATTR",
    "MeshDispatchFnDict",
    "MeshModeName",
    "NbytesFn",
    "PADDING_SIZE_KEY",
    "PlanFn",
    "PlannedDispatchFnDict",
    "RegisterAttrs",
    "Resolver",
    "ShardAdapter",
    "SizedShardAdapter",
    "Slot",
    "WorkPlan",
    "WorkUnit",
    "balanced_plan",
    "chunk_sizes",
    "even_plan",
    "get_future_resolver",
    "get_nbytes_fn",
    "get_register_attrs",
    "get_shard_adapter",
    "is_future",
    "is_shardable",
    "materialize",
    "mesh_layout",
    "mesh_slots",
    "payload_nbytes",
    "pop_padding_size",
    "rank_slots",
    "register_future_resolver",
    "register_future_type",
    "register_nbytes",
    "register_shardable",
    "resolve_dispatch_mode",
    "split_args_kwargs",
    "unpad_output",
]

_public.publish(globals())
