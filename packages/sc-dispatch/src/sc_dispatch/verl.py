"""verl's names for the parts of its ``single_controller.base.decorator`` module that a
sc-dispatch user does not need: the predefined dispatch and collect functions, the lookups
:func:`get_predefined_dispatch_fn` / :func:`get_predefined_execute_fn`, the read-only
:data:`DISPATCH_MODE_FN_REGISTRY`, :data:`MAGIC_ATTR`, and ``verl.utils.py_functional``'s
:class:`DynamicEnum` (the base of ``Dispatch`` and ``Execute``).

A verl program migrates by changing imports: ``register``, ``Dispatch``, ``Execute``,
``register_dispatch_mode``, ``update_dispatch_mode`` and
``make_nd_compute_dataproto_dispatch_fn`` come from :mod:`sc_dispatch`, these from here.
"""

from . import _public
from ._enums import DynamicEnum
from ._predefined import (
    collect_all_to_all,
    collect_direct_rollout_method,
    collect_dp_compute,
    collect_dp_compute_data_proto,
    collect_rank_zero,
    dispatch_all_to_all,
    dispatch_direct_rollout_method,
    dispatch_dp_compute,
    dispatch_dp_compute_data_proto,
    dispatch_dp_compute_data_proto_with_func,
    dispatch_one_to_all,
    dispatch_rank_zero,
)
from ._register import MAGIC_ATTR
from ._registry import (
    DISPATCH_MODE_FN_REGISTRY,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
)

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "DynamicEnum",
    "MAGIC_ATTR",
    "collect_all_to_all",
    "collect_direct_rollout_method",
    "collect_dp_compute",
    "collect_dp_compute_data_proto",
    "collect_rank_zero",
    "dispatch_all_to_all",
    "dispatch_direct_rollout_method",
    "dispatch_dp_compute",
    "dispatch_dp_compute_data_proto",
    "dispatch_dp_compute_data_proto_with_func",
    "dispatch_one_to_all",
    "dispatch_rank_zero",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
]

_public.publish(globals())
