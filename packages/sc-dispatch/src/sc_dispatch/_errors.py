"""The exceptions sc-dispatch raises.

Every error is raised explicitly (never through ``assert``) and subclasses the builtin
exception it means, so callers may catch either::

    DispatchError (ValueError)                 base class of everything below
    ├── UnknownDispatchModeError               a mode or execute mode that is not registered
    ├── DispatchModeExistsError                registering a mode name twice
    ├── InvalidDispatchModeError               a custom mode without a callable dispatch_fn
    │                                          and collect_fn, a bad @register argument, or
    │                                          a member name that is not an identifier or
    │                                          would shadow a class attribute
    ├── DispatchArgumentError                  arguments a mode cannot split: wrong lengths,
    │   │                                      a batch shorter than the number of shards, ...
    │   └── NotShardableError (also TypeError) a non-shardable argument to a splitting mode,
    │                                          or a non-callable function argument
    └── MeshLayoutError                        a mesh whose dp ranks are not 0..dp_size-1, or
                                               a dp group without exactly one collect rank

Messages name the dispatch mode and the offending value.
"""

from __future__ import annotations

__all__ = [
    "DispatchArgumentError",
    "DispatchError",
    "DispatchModeExistsError",
    "InvalidDispatchModeError",
    "MeshLayoutError",
    "NotShardableError",
    "UnknownDispatchModeError",
]


class DispatchError(ValueError):
    """Base class of every error raised by sc-dispatch."""


class UnknownDispatchModeError(DispatchError):
    """A dispatch or execute mode that is not registered."""


class DispatchModeExistsError(DispatchError):
    """A dispatch mode name that is already registered."""


class InvalidDispatchModeError(DispatchError):
    """A custom dispatch mode or ``@register`` argument that cannot be used."""


class DispatchArgumentError(DispatchError):
    """Arguments that a dispatch mode cannot split or collect."""


class NotShardableError(DispatchArgumentError, TypeError):
    """An argument of a type that a splitting mode does not know how to split."""


class MeshLayoutError(DispatchError):
    """A device mesh whose data-parallel layout cannot be dispatched to."""
