"""The exceptions sc-dispatch raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`ScDispatchError` and exactly one builtin exception, the one it means,
so callers may catch either::

    ScDispatchError (Exception)                base class of everything below
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
    ├── DirectRolloutCallError                 a ``DIRECT_ROLLOUT_METHOD`` method called
    │   (NotImplementedError)                  through a worker group
    ├── SettingValueError (ValueError)         an ``SC_*`` environment variable whose value
    │                                          does not parse (names the variable and value)
    └── SettingDeclarationError (ValueError)   a ``Setting`` declared with a bad name, a
                                               duration not named ``..._S``, no doc

The two setting errors belong to the private settings framework (``sc_dispatch._setting``,
which re-exports them); catch a bad value of an environment variable as a ``ValueError``.

Messages name the dispatch mode (or variable) and the offending value.
"""

from __future__ import annotations

__all__ = [
    "DirectRolloutCallError",
    "DispatchArgumentError",
    "ScDispatchError",
    "SettingDeclarationError",
    "SettingValueError",
    "DispatchModeExistsError",
    "DispatchModeTypeError",
    "InvalidDispatchModeError",
    "MeshLayoutError",
    "NotShardableError",
    "UnknownDispatchModeError",
]


class ScDispatchError(Exception):
    """Base class of every error raised by sc-dispatch."""


class UnknownDispatchModeError(ScDispatchError, KeyError):
    """A dispatch or execute mode, or a dynamic-enum member, that is not registered."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class DispatchModeTypeError(ScDispatchError, TypeError):
    """A value of the wrong type where a dispatch or execute mode (or its function) is needed."""


class DispatchModeExistsError(ScDispatchError, ValueError):
    """A dispatch mode or member name that is already registered."""


class InvalidDispatchModeError(ScDispatchError, ValueError):
    """A custom dispatch mode or ``@register`` argument whose value cannot be used."""


class DispatchArgumentError(ScDispatchError, ValueError):
    """Arguments that a dispatch mode cannot split or collect."""


class NotShardableError(ScDispatchError, TypeError):
    """An argument of a type that a splitting mode does not know how to split."""


class MeshLayoutError(ScDispatchError, ValueError):
    """A device mesh whose data-parallel layout cannot be dispatched to."""


class DirectRolloutCallError(ScDispatchError, NotImplementedError):
    """A ``DIRECT_ROLLOUT_METHOD`` method called through a worker group (the rollout engine
    calls it inside the worker)."""


class SettingValueError(ScDispatchError, ValueError):
    """An ``SC_*`` environment variable whose value does not parse as its setting's type."""


class SettingDeclarationError(ScDispatchError, ValueError):
    """A :class:`~sc_dispatch._setting.Setting` declared with a value it cannot work with."""
