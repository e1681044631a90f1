"""The exceptions sc-dispatch raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`DispatchError` and exactly one builtin exception, the one it means,
so callers may catch either::

    DispatchError (Exception)                  base class of everything below
    ├── UnknownDispatchModeError (KeyError)    a mode or member name that is not registered
    │                                          (``Dispatch["X"]``, ``Dispatch.remove("X")``,
    │                                          a member without dispatch/collect functions)
    ├── DispatchModeTypeError (TypeError)      something that is not a ``Dispatch`` /
    │                                          ``Execute`` member where one is needed (a
    │                                          string as ``dispatch_mode``), a non-callable
    │                                          dispatch or collect function, a non-bool flag
    ├── DispatchModeExistsError (ValueError)   registering a mode or member name twice
    ├── InvalidDispatchModeError (ValueError)  a custom mode mapping without both functions
    │                                          or with unknown keys, a member name that is not
    │                                          an identifier or would shadow a class
    │                                          attribute, RANK_ZERO with Execute.ALL
    ├── DispatchArgumentError (ValueError)     arguments a mode cannot split: wrong lengths,
    │                                          a batch that does not divide evenly into the
    │                                          shards (without auto-padding), ...
    ├── NotShardableError (TypeError)          an argument of a type a splitting mode does not
    │                                          split (a list given to DP_COMPUTE_PROTO, a dict)
    ├── MeshLayoutError (ValueError)           a mesh whose dp ranks are not 0..dp_size-1, or
    │                                          a dp group without exactly one collect rank
    └── DirectRolloutCallError                 a ``DIRECT_ROLLOUT_METHOD`` method called
        (NotImplementedError)                  through a worker group

Messages name the dispatch mode and the offending value.
"""

from __future__ import annotations

__all__ = [
    "DirectRolloutCallError",
    "DispatchArgumentError",
    "DispatchError",
    "DispatchModeExistsError",
    "DispatchModeTypeError",
    "InvalidDispatchModeError",
    "MeshLayoutError",
    "NotShardableError",
    "UnknownDispatchModeError",
]


class DispatchError(Exception):
    """Base class of every error raised by sc-dispatch."""


class UnknownDispatchModeError(DispatchError, KeyError):
    """A dispatch or execute mode, or a dynamic-enum member, that is not registered."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class DispatchModeTypeError(DispatchError, TypeError):
    """A value of the wrong type where a dispatch or execute mode (or its function) is needed."""


class DispatchModeExistsError(DispatchError, ValueError):
    """A dispatch mode or member name that is already registered."""


class InvalidDispatchModeError(DispatchError, ValueError):
    """A custom dispatch mode or ``@register`` argument whose value cannot be used."""


class DispatchArgumentError(DispatchError, ValueError):
    """Arguments that a dispatch mode cannot split or collect."""


class NotShardableError(DispatchError, TypeError):
    """An argument of a type that a splitting mode does not know how to split."""


class MeshLayoutError(DispatchError, ValueError):
    """A device mesh whose data-parallel layout cannot be dispatched to."""


class DirectRolloutCallError(DispatchError, NotImplementedError):
    """A ``DIRECT_ROLLOUT_METHOD`` method called through a worker group (the rollout engine
    calls it inside the worker)."""
