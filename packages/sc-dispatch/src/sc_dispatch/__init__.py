"""sc-dispatch: how a call on a worker group is split across workers and joined back.

Standard library only. This module holds what a user of worker groups writes: a worker
method declares its dispatch mode with :func:`register` (``Dispatch.DP_COMPUTE_PROTO``, a
mode made by one of the ``make_*_dispatch_fn`` factories, or one registered with
:func:`register_dispatch_mode`), and the errors to catch. Two more public modules hold the
rest:

* :mod:`sc_dispatch.ext`, the extender tier: for people writing a worker group or RPC
  layer, a shardable container's adapter, a future type, or a dispatch mode from parts
  (work plans, the mode lookup :func:`~sc_dispatch.ext.resolve_dispatch_mode`, the protocols
  a worker group and a container must meet);
* :mod:`sc_dispatch.verl`, verl's names: the predefined ``dispatch_*`` / ``collect_*``
  functions, ``get_predefined_dispatch_fn``, ``DISPATCH_MODE_FN_REGISTRY``, ``DynamicEnum``.
"""

from . import _public
from ._enums import (
    CollectsList,
    CollectsResult,
    Dispatch,
    Execute,
    PerRankCollectsList,
)
from ._errors import (
    DirectRolloutCallError,
    DispatchArgumentError,
    DispatchModeExistsError,
    DispatchModeTypeError,
    InvalidDispatchModeError,
    MeshLayoutError,
    NotShardableError,
    ScDispatchError,
    UnknownDispatchModeError,
)
from ._modes import make_balanced_dispatch_fn, make_sticky_dispatch_fn
from ._nd import make_nd_compute_dataproto_dispatch_fn
from ._register import register
from ._registry import register_dispatch_mode, update_dispatch_mode
from ._shard import Rows
from ._spec import DispatchFnDict
from ._typed import RegisteredMethod

__version__ = "0.2.0"

__all__ = [
    "CollectsList",
    "CollectsResult",
    "DirectRolloutCallError",
    "Dispatch",
    "DispatchArgumentError",
    "DispatchFnDict",
    "DispatchModeExistsError",
    "DispatchModeTypeError",
    "Execute",
    "InvalidDispatchModeError",
    "MeshLayoutError",
    "NotShardableError",
    "PerRankCollectsList",
    "RegisteredMethod",
    "Rows",
    "ScDispatchError",
    "UnknownDispatchModeError",
    "__version__",
    "make_balanced_dispatch_fn",
    "make_nd_compute_dataproto_dispatch_fn",
    "make_sticky_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]

_public.publish(globals())

# The second tier, imported here so that its names report their public module from the start.
from . import ext, verl  # noqa: E402, F401
