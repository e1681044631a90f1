"""A drop-in for verl's ``single_controller.base.decorator`` module: everything that module
offers and sc has, under verl's names, so that verl code written against the module as an
alias (``import verl.single_controller.base.decorator as decorator``, then
``decorator.register``, ``decorator.Dispatch``, ``decorator.DISPATCH_MODE_FN_REGISTRY``)
migrates by changing that one line to ``import sc_dispatch.verl as decorator``.

What a worker class and its caller write (:func:`register`, :class:`Dispatch`,
:class:`Execute`, :func:`register_dispatch_mode`, :func:`update_dispatch_mode`,
:func:`make_nd_compute_dataproto_dispatch_fn`) is the same object as in :mod:`sc_dispatch`,
re-exported here; the rest is verl's only: the predefined dispatch and collect functions,
the lookups :func:`get_predefined_dispatch_fn` / :func:`get_predefined_execute_fn`, the
read-only :data:`DISPATCH_MODE_FN_REGISTRY`, :data:`MAGIC_ATTR`, and
``verl.utils.py_functional``'s :class:`DynamicEnum` (the base of ``Dispatch`` and
``Execute``). verl's Megatron dispatch functions have no counterpart here: sc's
``make_nd_compute_dataproto_dispatch_fn`` meshes cover them.
"""

from . import _public
from ._enums import Dispatch, DynamicEnum, Execute
from ._nd import make_nd_compute_dataproto_dispatch_fn
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
from ._register import MAGIC_ATTR, register
from ._registry import (
    DISPATCH_MODE_FN_REGISTRY,
    get_predefined_dispatch_fn,
    get_predefined_execute_fn,
    register_dispatch_mode,
    update_dispatch_mode,
)

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "Dispatch",
    "DynamicEnum",
    "Execute",
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
    "make_nd_compute_dataproto_dispatch_fn",
    "register",
    "register_dispatch_mode",
    "update_dispatch_mode",
]

_public.publish(globals())
