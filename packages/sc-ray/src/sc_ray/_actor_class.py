"""The class sc-ray runs as an actor: the user's worker class plus sc-ray's entry points.

:func:`actor_class` subclasses the worker class (the user's own class stays untouched) with

* a constructor keyword ``_sc_env`` whose variables go into ``os.environ`` before the
  worker's own constructor runs (cheaper than a Ray ``runtime_env`` per rank, which would
  start a fresh worker process per distinct environment);
* a constructor keyword ``_sc_standby`` that builds no worker (a hot standby, see
  ``_standby.py``), and ``_sc_take_over(env, args, kwargs)``, which later sets the rank's
  environment and runs the worker's constructor in that process;
* one *twin* ``_sc_m_<name>`` per registered method (and the fused ``_fuw_execute``): it
  runs the method and turns an exception into a :class:`~sc_core.WorkerError` naming the
  method and the rank (and still an instance of the original exception's class), so that
  ``ray.get`` on a call's references raises it too. A twin is called like the method itself,
  so a call carries no extra argument;
* ``_sc_call(name, ...)``, the same for any other method (verl's ``execute_all_async`` may
  name one that is not registered);
* ``_sc_call_with_meta(name, ...)``, the same returning ``(row_count, value)``, so that a
  non-blocking call of a splitting mode knows its shards' row counts without fetching them;
* ``_sc_fingerprint()``, the worker's code and configuration as recorded when its
  constructor ran (``_fingerprint.py``), which a driver re-attaching to a run compares.

Every entry point first fires a fault armed for its method by ``WorkerGroup.inject_fault``
(a call answered from the journal fires none: it does not start the method).

The actors of a detached group (a run's workers) have a Ray concurrency group of their own,
:data:`CONTROL_GROUP`, beside the default one: sc-core's control lane (``sc_core.backend.
on_control_lane``: the framework's queries, the fingerprint, calls answered from the
journal) runs there, so that a rank busy in a call (a torn call, whose peers never got it)
still answers a re-attaching driver at once. Their methods then run on a thread of the
default group (one, in order, as before), not on the process's main thread.

Entry points are ``async`` only if the class already has ``async`` methods (Ray then runs
the actor as an async actor anyway).
"""

from __future__ import annotations

import inspect
import os
import traceback
from collections.abc import Callable, Mapping
from typing import Any, cast

from sc_core import WorkerError
from sc_core.backend import JOURNAL_LANE_KWARG, run_journaled, run_journaled_async, take_fault
from sc_dispatch.ext import get_register_attrs

from ._fingerprint import Fingerprint, fingerprint
from ._futures import row_meta
from ._wire import ensure_tensordict_wire, is_tensordict

__all__ = [
    "CALL_METHOD",
    "CONTROL_GROUP",
    "CONTROL_THREADS",
    "ENV_KWARG",
    "FINGERPRINT_METHOD",
    "META_METHOD",
    "STANDBY_KWARG",
    "TAKE_OVER_METHOD",
    "TWIN_PREFIX",
    "actor_class",
    "twin_names",
]

#: The Ray concurrency group of a detached actor's control lane (see the module docstring).
CONTROL_GROUP = "sc_control"
#: Its threads: queries answer at once; a call answered from the journal may wait there for
#: the running original.
CONTROL_THREADS = 8
CALL_METHOD = "_sc_call"
META_METHOD = "_sc_call_with_meta"
ENV_KWARG = "_sc_env"
STANDBY_KWARG = "_sc_standby"
TAKE_OVER_METHOD = "_sc_take_over"
FINGERPRINT_METHOD = "_sc_fingerprint"
#: The instance attribute holding the fingerprint recorded at construction.
_FINGERPRINT_ATTR = "_sc_fingerprint_recorded"
TWIN_PREFIX = "_sc_m_"
#: The attribute of an actor class listing the methods that have twins.
TWINS_ATTR = "_sc_twinned_methods"


def _worker_error(instance: Any, name: str, exc: Exception) -> WorkerError:
    """The error a worker raises for a method that raised ``exc``: names the method and the
    rank, and is an instance of ``type(exc)`` too (see :class:`sc_core.WorkerError`)."""
    rank = instance.__dict__.get("_rank")
    if not isinstance(rank, int):
        raw = os.environ.get("RANK", "")
        rank = int(raw) if raw.isdigit() else -1
    tb = exc.__traceback__
    tb = tb.tb_next if tb is not None and tb.tb_next is not None else tb  # skip the wrapper
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return WorkerError.from_exception(name, rank, exc, remote_traceback=text)


def _fire_armed_fault(
    instance: Any, method: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> None:
    """Fire the fault ``WorkerGroup.inject_fault`` armed for ``method``, if any: exit this
    process (now or on a timer) or raise ``InjectedFaultError``. A call answered from the
    journal (``JOURNAL_LANE_KWARG``) does not start the method: it fires none."""
    if kwargs.get(JOURNAL_LANE_KWARG) is True:
        return
    fault = take_fault(instance, method, args)
    if fault is not None:
        rank = instance.__dict__.get("_rank")
        fault.fire_in_process(rank if isinstance(rank, int) else -1)


def _to_driver(out: Any) -> Any:
    """A method's result on its way back to the driver: a TensorDict sets up its wire
    format first."""
    if is_tensordict(out):
        ensure_tensordict_wire()
    return out


def _entry(name: str | None, is_async: bool) -> Callable[..., Any]:
    """An entry point running method ``name`` (or, with ``name=None``, the method named by
    the first argument), converting its exception; a call with an id runs once per id
    (``sc_core.backend.run_journaled``: a replay gets the stored outcome)."""
    if is_async:

        async def run_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            method, args = (args[0], args[1:]) if name is None else (name, args)

            async def call(kw: dict[str, Any]) -> Any:
                out = getattr(self, method)(*args, **kw)
                return (await out) if inspect.isawaitable(out) else out

            try:
                _fire_armed_fault(self, method, args, kwargs)  # before the journal: no outcome
                out = await run_journaled_async(self, method, kwargs, call, args)
            except Exception as exc:
                raise _worker_error(self, method, exc) from exc
            return _to_driver(out)

        return run_async

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        method, args = (args[0], args[1:]) if name is None else (name, args)

        def call(kw: dict[str, Any]) -> Any:
            return getattr(self, method)(*args, **kw)

        try:
            _fire_armed_fault(self, method, args, kwargs)  # before the journal: no outcome
            out = run_journaled(self, method, kwargs, call, args)
        except Exception as exc:
            raise _worker_error(self, method, exc) from exc
        return _to_driver(out)

    return run


def _with_meta(call: Callable[..., Any], is_async: bool) -> Callable[..., Any]:
    if is_async:

        async def with_meta_async(self: Any, *args: Any, **kwargs: Any) -> Any:
            out = await call(self, *args, **kwargs)
            return row_meta(out), out

        return with_meta_async

    def with_meta(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = call(self, *args, **kwargs)
        return row_meta(out), out

    return with_meta


def _registered_names(cls: type) -> list[str]:
    names = []
    for name in dir(cls):
        try:
            attr = getattr(cls, name)
        except Exception:  # a descriptor that fails on the class is no registered method
            continue
        if callable(attr) and get_register_attrs(attr) is not None:
            names.append(name)
    if callable(getattr(cls, "_fuw_execute", None)):
        names.append("_fuw_execute")
    return names


def twin_names(actor_cls: type) -> frozenset[str]:
    """The methods of an actor class built by :func:`actor_class` that have twins."""
    return cast("frozenset[str]", getattr(actor_cls, TWINS_ATTR, frozenset()))


def actor_class(cls: type) -> type:
    """``cls`` with sc-ray's entry points (see the module docstring)."""
    roles: Mapping[str, type] = getattr(cls, "raw_cls_dict", None) or {}
    has_async = any(
        inspect.iscoroutinefunction(getattr(klass, name, None))
        for klass in (cls, *roles.values())
        for name in dir(klass)
        if not name.startswith("__")
    )
    namespace: dict[str, Any] = {}
    if has_async and getattr(cls, "is_fused_worker", False):
        # A fused worker's _fuw_execute is plain; make it await async role methods.
        fused_execute = cast(Any, cls)._fuw_execute

        async def _fuw_execute(self: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
            out = fused_execute(self, method_name, *args, **kwargs)
            if inspect.isawaitable(out):
                out = await out
            return out

        namespace["_fuw_execute"] = _fuw_execute
    call = _entry(None, has_async)
    call.__name__ = CALL_METHOD
    meta = _with_meta(call, has_async)
    meta.__name__ = META_METHOD
    twinned = _registered_names(cls)
    for name in twinned:
        twin = _entry(name, has_async)
        twin.__name__ = f"{TWIN_PREFIX}{name}"
        namespace[twin.__name__] = twin

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if kwargs.pop(STANDBY_KWARG, False):
            # a hot standby: the worker is built by _sc_take_over
            self.__dict__[_FINGERPRINT_ATTR] = fingerprint(cls, None, None)
            return
        env = kwargs.pop(ENV_KWARG, None)
        # before the constructor runs: it may change its arguments in place
        self.__dict__[_FINGERPRINT_ATTR] = fingerprint(cls, args, kwargs)
        if env:
            os.environ.update(env)
        cast(Any, cls).__init__(self, *args, **kwargs)

    def _sc_take_over(
        self: Any, env: Mapping[str, str], args: tuple[Any, ...], kwargs: Mapping[str, Any]
    ) -> None:
        os.environ.update(env)
        self.__dict__[_FINGERPRINT_ATTR] = fingerprint(cls, args, kwargs)
        try:
            cast(Any, cls).__init__(self, *args, **kwargs)
        except Exception as exc:
            raise _worker_error(self, "__init__", exc) from exc

    def _sc_fingerprint(self: Any) -> Fingerprint:
        return cast(Fingerprint, self.__dict__.get(_FINGERPRINT_ATTR) or {})

    namespace.update(
        {
            FINGERPRINT_METHOD: _sc_fingerprint,
            CALL_METHOD: call,
            META_METHOD: meta,
            TAKE_OVER_METHOD: _sc_take_over,
            TWINS_ATTR: frozenset(twinned),
            "_sc_framework_class": True,
            "__init__": __init__,
            "__module__": cls.__module__,
            "__doc__": cls.__doc__,
        }
    )
    sub = type(cls.__name__, (cls,), namespace)
    sub.__qualname__ = cls.__qualname__
    return sub
