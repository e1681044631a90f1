"""A worker's two lanes: its calls in order, and the control lane beside them.

A worker runs its methods one after the other, in the order they came: its *main lane*. A
rank busy in a long call (a collective whose peers never got the call: a *torn* call, left
by a driver killed while it handed the call out) takes nothing else on that lane until the
call ends. What a re-attaching driver must still ask of it goes on the *control lane*, which
a backend runs beside the main one (the in-process backend on a second thread per rank,
sc-ray in a concurrency group of the actors of a detached run):

* the framework's queries, :data:`CONTROL_METHODS`: where the worker stands
  (``_sc_last_calls``, ``_sc_journal_calls``, ``_sc_await_call``), its pid, its mesh
  tables; they read state and never wait for the main lane;
* a call sent with :data:`~sc_core.backend.JOURNAL_LANE_KWARG`: a call the rank's journal
  holds, answered from it (or from the running original once it ends), never run.

:func:`on_control_lane` is what a backend asks of each rank's call. A backend without a
control lane runs both on the main one: correct, but a rank busy in a torn call answers
them only once that call ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._journal import JOURNAL_LANE_KWARG, method_label

__all__ = [
    "AWAIT_CALL_METHOD",
    "CONTROL_METHODS",
    "JOURNAL_CALLS_METHOD",
    "LAST_CALLS_METHOD",
    "is_control_method",
    "on_control_lane",
]

#: The worker method that answers :meth:`WorkerGroup.last_calls <sc_core.WorkerGroup.last_calls>`.
LAST_CALLS_METHOD = "_sc_last_calls"
#: The worker method that answers :meth:`WorkerGroup.journaled_calls
#: <sc_core.WorkerGroup.journaled_calls>`.
JOURNAL_CALLS_METHOD = "_sc_journal_calls"
#: The worker method that waits until a call has reached the worker.
AWAIT_CALL_METHOD = "_sc_await_call"

#: The framework's worker methods that run on the control lane: they read the worker's
#: state (its journal, its pid, its mesh tables) and never wait for its running call.
CONTROL_METHODS = frozenset(
    {
        LAST_CALLS_METHOD,
        JOURNAL_CALLS_METHOD,
        AWAIT_CALL_METHOD,
        "_get_pid",
        "_query_dispatch_info",
        "_query_collect_info",
        "_query_receives_data_info",
    }
)


def is_control_method(method_name: str) -> bool:
    """Whether ``method_name`` is one of :data:`CONTROL_METHODS`, also as a colocated
    class exposes a role's method (``{role}_{method}``: every control method's name starts
    with ``_``, so the role's form ends with ``_`` + it)."""
    if method_name in CONTROL_METHODS:
        return True
    head, sep, tail = method_name.rpartition("__")
    return bool(head and sep) and f"_{tail}" in CONTROL_METHODS


def on_control_lane(method_name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> bool:
    """Whether a backend runs this rank's call on the control lane (see the module
    docstring): a framework query, or a call answered from the journal only. ``args``
    name the method a fused worker's ``_fuw_execute`` runs."""
    if kwargs.get(JOURNAL_LANE_KWARG) is True:
        return True
    return is_control_method(method_label(method_name, args))
