"""The dispatch-mode registry: the predefined modes, modes that extensions register, and the
lookups a worker group makes (:func:`resolve_dispatch_mode`, verl's
:func:`get_predefined_dispatch_fn` and :func:`get_predefined_execute_fn`)."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import Any

from . import _predefined as fns
from ._enums import Dispatch, Execute
from ._errors import (
    DispatchModeExistsError,
    DispatchModeTypeError,
    InvalidDispatchModeError,
    UnknownDispatchModeError,
)
from ._modes import plan_balanced_proto
from ._plan import WorkPlan, even_plan, rank_slots
from ._spec import (
    CollectFn,
    DispatchAwareCollectFn,
    DispatchFn,
    DispatchFnDict,
    DispatchModeSpec,
    ExecuteFnDict,
    FunctionMode,
)

__all__ = [
    "DISPATCH_MODE_FN_REGISTRY",
    "get_predefined_dispatch_fn",
    "get_predefined_execute_fn",
    "register_dispatch_mode",
    "resolve_dispatch_mode",
    "update_dispatch_mode",
]

_lock = threading.Lock()
_registry: dict[Dispatch, DispatchModeSpec] = {}


def plan_dp_compute_proto(worker_group: Any, *args: Any, **kwargs: Any) -> WorkPlan:
    """``DP_COMPUTE_PROTO``'s plan: one shard per rank, pinned to it."""
    return even_plan("DP_COMPUTE_PROTO", rank_slots(worker_group), args, dict(kwargs))


def _functions(
    name: str, dispatch_fn: DispatchFn, collect_fn: CollectFn, **flags: bool
) -> DispatchModeSpec:
    return DispatchModeSpec.from_functions(FunctionMode(name, dispatch_fn, collect_fn, **flags))


def _install_predefined() -> None:
    """verl's modes: the splitting ones plan natively (and keep verl's functions for the
    ``func_generator`` hook); the rest are verl's functions, one unit per rank."""
    split = FunctionMode(
        "DP_COMPUTE_PROTO",
        fns.dispatch_dp_compute_data_proto,
        fns.collect_dp_compute_data_proto,
        row_aligned=True,
    )
    _registry[Dispatch.RANK_ZERO] = _functions(
        "RANK_ZERO", fns.dispatch_rank_zero, fns.collect_rank_zero
    )
    _registry[Dispatch.ONE_TO_ALL] = _functions(
        "ONE_TO_ALL", fns.dispatch_one_to_all, fns.collect_all_to_all
    )
    _registry[Dispatch.ALL_TO_ALL] = _functions(
        "ALL_TO_ALL", fns.dispatch_all_to_all, fns.collect_all_to_all
    )
    _registry[Dispatch.DP_COMPUTE] = _functions(
        "DP_COMPUTE", fns.dispatch_dp_compute, fns.collect_dp_compute
    )
    _registry[Dispatch.DP_COMPUTE_PROTO] = DispatchModeSpec(
        "DP_COMPUTE_PROTO", plan_dp_compute_proto, True, split
    )
    _registry[Dispatch.DP_COMPUTE_PROTO_BALANCED] = DispatchModeSpec(
        "DP_COMPUTE_PROTO_BALANCED", plan_balanced_proto, True, split
    )
    _registry[Dispatch.DP_COMPUTE_PROTO_WITH_FUNC] = _functions(
        "DP_COMPUTE_PROTO_WITH_FUNC",
        fns.dispatch_dp_compute_data_proto_with_func,
        fns.collect_dp_compute_data_proto,
        row_aligned=True,
    )
    _registry[Dispatch.DP_COMPUTE_METRIC] = _functions(
        "DP_COMPUTE_METRIC",
        fns.dispatch_dp_compute_data_proto,
        fns.collect_dp_compute,
        unpad_output=False,
    )
    _registry[Dispatch.DIRECT_ROLLOUT_METHOD] = _functions(
        "DIRECT_ROLLOUT_METHOD",
        fns.dispatch_direct_rollout_method,
        fns.collect_direct_rollout_method,
    )


_install_predefined()


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> DispatchFnDict:
    """verl's lookup: ``{"dispatch_fn": ..., "collect_fn": ...}`` for a registered mode.

    Anything that is not a registered :class:`Dispatch` member (a string, a member without
    functions) is an unknown name, as in verl's dict lookup: an
    :class:`~sc_dispatch.UnknownDispatchModeError` (a ``KeyError``) naming the known modes.
    """
    spec = _registry.get(dispatch_mode) if isinstance(dispatch_mode, Dispatch) else None
    if spec is None:
        raise UnknownDispatchModeError(
            f"get_predefined_dispatch_fn: no dispatch mode {dispatch_mode!r}; "
            f"known: {sorted(mode.name for mode in _registry)}"
        )
    return {"dispatch_fn": spec.dispatch_fn, "collect_fn": spec.collect_fn}


def _live_modes() -> list[Dispatch]:
    """The registered modes whose member is still in ``Dispatch`` (``Dispatch.remove`` takes
    a member out of the enum, not its functions out of the registry)."""
    return [mode for mode in list(_registry) if Dispatch.from_name(mode.name) is mode]


class _ModeFunctions(Mapping[Dispatch, DispatchFnDict]):
    """A live, read-only view of the registry in verl's shape: each registered mode's
    ``{"dispatch_fn": ..., "collect_fn": ...}``. Register or change modes with
    :func:`register_dispatch_mode` and :func:`update_dispatch_mode`."""

    def __getitem__(self, dispatch_mode: Dispatch) -> DispatchFnDict:
        functions = get_predefined_dispatch_fn(dispatch_mode)
        if Dispatch.from_name(dispatch_mode.name) is not dispatch_mode:
            raise UnknownDispatchModeError(
                f"DISPATCH_MODE_FN_REGISTRY: {dispatch_mode!r} was removed from Dispatch"
            )
        return functions

    def __iter__(self) -> Iterator[Dispatch]:
        return iter(_live_modes())

    def __len__(self) -> int:
        return len(_live_modes())

    def __repr__(self) -> str:
        return f"DISPATCH_MODE_FN_REGISTRY({sorted(mode.name for mode in _live_modes())})"

    def copy(self) -> dict[Dispatch, DispatchFnDict]:
        """A snapshot as a plain dict (verl code copies the registry to restore it later;
        restore with :func:`update_dispatch_mode`, or remove added modes with
        ``Dispatch.remove``)."""
        return {mode: self[mode] for mode in _live_modes()}


#: verl's ``DISPATCH_MODE_FN_REGISTRY``, as a read-only view (item assignment is a
#: ``TypeError``): iterate it, look modes up, test membership.
DISPATCH_MODE_FN_REGISTRY = _ModeFunctions()


def _lookup(dispatch_mode: Dispatch) -> DispatchModeSpec:
    if not isinstance(dispatch_mode, Dispatch):
        raise DispatchModeTypeError(
            f"expected a Dispatch member, got {type(dispatch_mode).__qualname__} {dispatch_mode!r}"
        )
    spec = _registry.get(dispatch_mode)
    if spec is None:
        raise UnknownDispatchModeError(
            f"dispatch mode {dispatch_mode.name} has no dispatch/collect functions; "
            "register it with sc_dispatch.register_dispatch_mode"
        )
    return spec


_OPTIONAL_KEYS = ("collect_sees_dispatch", "name", "plan_fn", "row_aligned", "unpad_output")
_MAPPING_KEYS = frozenset({"dispatch_fn", "collect_fn", *_OPTIONAL_KEYS})


def resolve_dispatch_mode(dispatch_mode: Dispatch | Mapping[str, Any]) -> DispatchModeSpec:
    """The :class:`DispatchModeSpec` of a registered mode or of a custom-mode mapping.

    A mapping is verl's ``{"dispatch_fn": ..., "collect_fn": ...}``, optionally with the
    flags of :class:`FunctionMode` and a ``name``; one with a ``plan_fn`` too (the N-d,
    balanced and sticky modes) plans with it, its outputs row-aligned unless
    ``row_aligned`` is false."""
    if isinstance(dispatch_mode, Dispatch):
        return _lookup(dispatch_mode)
    if isinstance(dispatch_mode, Mapping):
        missing = [k for k in ("dispatch_fn", "collect_fn") if k not in dispatch_mode]
        if missing:
            raise InvalidDispatchModeError(
                f"custom dispatch mode {dict(dispatch_mode)!r} lacks {missing}; "
                "give both 'dispatch_fn' and 'collect_fn'"
            )
        unknown = set(dispatch_mode) - _MAPPING_KEYS
        if unknown:
            raise InvalidDispatchModeError(
                f"custom dispatch mode has unknown keys {sorted(unknown)}; "
                f"expected 'dispatch_fn', 'collect_fn' and optionally {sorted(_OPTIONAL_KEYS)}"
            )
        name = str(
            dispatch_mode.get("name", getattr(dispatch_mode["dispatch_fn"], "__name__", "custom"))
        )
        plan_fn = dispatch_mode.get("plan_fn")
        functions = FunctionMode(
            name,
            dispatch_mode["dispatch_fn"],
            dispatch_mode["collect_fn"],
            dispatch_mode.get("unpad_output", True),
            dispatch_mode.get("row_aligned", plan_fn is not None),
            dispatch_mode.get("collect_sees_dispatch", False),
        )
        if plan_fn is None:
            return DispatchModeSpec.from_functions(functions)
        return DispatchModeSpec(name, plan_fn, functions.row_aligned, functions)
    raise DispatchModeTypeError(
        f"dispatch_mode must be a Dispatch member or a mapping with 'dispatch_fn' and "
        f"'collect_fn', got {type(dispatch_mode).__qualname__} {dispatch_mode!r}"
    )


def register_dispatch_mode(
    dispatch_mode_name: str,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn | DispatchAwareCollectFn,
    *,
    unpad_output: bool = True,
    row_aligned: bool = False,
    collect_sees_dispatch: bool = False,
) -> Dispatch:
    """Add a new ``Dispatch`` member called ``dispatch_mode_name.upper()`` with its
    functions and return it.

    The flags are those of :class:`~sc_dispatch.ext.FunctionMode`: ``unpad_output``
    (drop dispatch padding from the output), ``row_aligned`` (``collect_fn`` joins
    row shards) and ``collect_sees_dispatch`` (``collect_fn`` also takes
    ``dispatched=(args, kwargs)``, what ``dispatch_fn`` returned for the call); each must
    be a bool (else a :class:`~sc_dispatch.DispatchModeTypeError`).

    A name that is already a ``Dispatch`` member is a
    :class:`~sc_dispatch.DispatchModeExistsError` (use :func:`update_dispatch_mode` to change
    an existing mode).
    """
    if not isinstance(dispatch_mode_name, str):
        raise DispatchModeTypeError(
            f"register_dispatch_mode: the mode name must be a str, got "
            f"{type(dispatch_mode_name).__qualname__} {dispatch_mode_name!r}"
        )
    name = dispatch_mode_name.upper()
    functions = FunctionMode(
        name, dispatch_fn, collect_fn, unpad_output, row_aligned, collect_sees_dispatch
    )
    with _lock:
        if name in Dispatch:
            raise DispatchModeExistsError(
                f"register_dispatch_mode: dispatch mode {dispatch_mode_name!r} already exists; "
                "use update_dispatch_mode to replace its functions"
            )
        member = Dispatch.register(dispatch_mode_name)
        _registry[member] = DispatchModeSpec.from_functions(functions)
    return member


def update_dispatch_mode(
    dispatch_mode: Dispatch,
    dispatch_fn: DispatchFn,
    collect_fn: CollectFn | DispatchAwareCollectFn,
    *,
    unpad_output: bool | None = None,
    row_aligned: bool | None = None,
    collect_sees_dispatch: bool | None = None,
) -> None:
    """Replace the functions of an existing dispatch mode (a ``Dispatch`` member, else a
    :class:`~sc_dispatch.DispatchModeTypeError`); ``unpad_output``, ``row_aligned`` and
    ``collect_sees_dispatch`` keep their values unless given. The mode then runs verl's way,
    one unit per rank (a predefined splitting mode gives up its native plan)."""
    with _lock:
        old = _lookup(dispatch_mode)
        flags = old.functions or FunctionMode(old.name, dispatch_fn, collect_fn)
        functions = FunctionMode(
            old.name,
            dispatch_fn,
            collect_fn,
            flags.unpad_output if unpad_output is None else unpad_output,
            flags.row_aligned if row_aligned is None else row_aligned,
            flags.collect_sees_dispatch if collect_sees_dispatch is None else collect_sees_dispatch,
        )
        _registry[dispatch_mode] = DispatchModeSpec.from_functions(functions)


def get_predefined_execute_fn(execute_mode: Execute) -> ExecuteFnDict:
    """verl's lookup: the name of the worker-group method that runs a call. Anything but
    ``Execute.ALL`` and ``Execute.RANK_ZERO`` is an unknown name, as in verl: an
    :class:`~sc_dispatch.UnknownDispatchModeError` (a ``KeyError``)."""
    if execute_mode is Execute.ALL:
        return {"execute_fn_name": "execute_all"}
    if execute_mode is Execute.RANK_ZERO:
        return {"execute_fn_name": "execute_rank_zero"}
    raise UnknownDispatchModeError(
        f"get_predefined_execute_fn: no execute mode {execute_mode!r}; known: ['ALL', 'RANK_ZERO']"
    )
