"""sc-dispatch's extender tier: the parts a worker group, a container or a mode is made of.

For people who write a worker group or RPC layer (sc-core's groups use exactly this), teach
sc-dispatch a container type or a future type, or build a dispatch mode from parts. A user of
worker groups needs none of it: :mod:`sc_dispatch` holds ``register``, the modes and the
errors.

* Running a call: :func:`resolve_dispatch_mode` turns a method's mode into a
  :class:`DispatchModeSpec` (a name, a planner, whether outputs are row-aligned, verl's
  functions as a :class:`FunctionMode`); ``spec.plan(...)`` gives the call's
  :class:`WorkPlan`; :func:`get_register_attrs` reads what ``@register`` stored (under
  :data:`MAGIC_ATTR`); :func:`materialize` resolves futures among the arguments;
  :data:`PADDING_SIZE_KEY` / :func:`pop_padding_size` and :func:`unpad_output` handle the
  rows a verl-style splitting dispatch padded; :func:`concat_outputs` joins row shards.
* What a worker group must offer: the :class:`DispatchWorkerGroup` protocol
  (``world_size``, ``query_mesh`` returning a :class:`MeshLayout`, which
  :func:`ask_mesh_layout` builds from verl's two per-rank queries), and :func:`mesh_layout`
  to ask it a mesh's layout. :mod:`sc_dispatch.testing` has a fake group for tests.
* Containers and futures: :func:`register_shardable` with a :class:`ShardAdapter` (or a
  :class:`SizedShardAdapter`, which also knows its bytes), :func:`get_shard_adapter`,
  :func:`is_shardable`, :func:`split_args_kwargs`, :func:`chunk_sizes`;
  :func:`register_future_type`, :func:`is_future`, :func:`register_future_resolver` /
  :func:`get_future_resolver` (a :data:`Resolver`) and the :class:`FutureLike` protocol.
* Payload sizes: :func:`payload_nbytes`, :func:`register_nbytes` (an :data:`NbytesFn`),
  :func:`get_nbytes_fn`.
* Work plans, the form of every call: :class:`WorkPlan` of :class:`WorkUnit` s on
  :class:`Slot` s, made by a :class:`PlanFn` such as :func:`even_plan`,
  :func:`balanced_plan`, :func:`rank_plan` (verl's per-rank rule, :func:`per_rank_arguments`)
  or :func:`rank_zero_plan` over :func:`rank_slots` / :func:`mesh_slots`; :class:`KeyAffinity`,
  the sticky router.
* The shapes of modes: :data:`DispatchFn`, :data:`CollectFn`,
  :class:`DispatchAwareCollectFn` (given :data:`Dispatched`), :class:`ExecuteFnDict`, and
  the mappings the factories return (:class:`MeshDispatchFnDict`, named by a
  :data:`MeshModeName`; :class:`PlannedDispatchFnDict`).
"""

from . import _public
from ._mesh import MeshLayout, ask_mesh_layout
from ._modes import KeyAffinity, PlannedDispatchFnDict
from ._nbytes import NbytesFn, get_nbytes_fn, payload_nbytes, register_nbytes
from ._nd import MeshDispatchFnDict, MeshModeName, mesh_layout, mesh_slots
from ._plan import (
    DEFAULT_UNITS_PER_SLOT,
    PlanFn,
    Slot,
    WorkPlan,
    WorkUnit,
    balanced_plan,
    even_plan,
    rank_plan,
    rank_slots,
    rank_zero_plan,
)
from ._protocols import DispatchWorkerGroup, FutureLike, ShardAdapter, SizedShardAdapter
from ._register import MAGIC_ATTR, RegisterAttrs, get_register_attrs, materialize
from ._registry import resolve_dispatch_mode
from ._shard import (
    PADDING_SIZE_KEY,
    Resolver,
    chunk_sizes,
    concat_outputs,
    get_future_resolver,
    get_shard_adapter,
    is_future,
    is_shardable,
    per_rank_arguments,
    pop_padding_size,
    register_future_resolver,
    register_future_type,
    register_shardable,
    split_args_kwargs,
    unpad_output,
)
from ._spec import (
    CollectFn,
    DispatchAwareCollectFn,
    Dispatched,
    DispatchFn,
    DispatchModeSpec,
    ExecuteFnDict,
    FunctionMode,
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
    "FunctionMode",
    "FutureLike",
    "KeyAffinity",
    "MAGIC_ATTR",
    "MeshDispatchFnDict",
    "MeshLayout",
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
    "ask_mesh_layout",
    "balanced_plan",
    "chunk_sizes",
    "concat_outputs",
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
    "per_rank_arguments",
    "pop_padding_size",
    "rank_plan",
    "rank_slots",
    "rank_zero_plan",
    "register_future_resolver",
    "register_future_type",
    "register_nbytes",
    "register_shardable",
    "resolve_dispatch_mode",
    "split_args_kwargs",
    "unpad_output",
]

_public.publish(globals())
