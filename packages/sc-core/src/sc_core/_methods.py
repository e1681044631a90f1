"""The table of a worker group's bound methods: it owns binding, rebinding and unbinding.

verl binds by attribute, and so does sc: a bound method is an attribute of the group
(``wg.generate``). :class:`MethodTable` is the one place that sets and removes those
attributes, and remembers which names it set, so that a name the group already uses is
refused rather than overwritten and a view (a spawned group) can be rebound from its
parent's table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ._errors import MethodCollisionError

__all__ = ["MethodTable"]


class MethodTable:
    """The bound methods of ``owner``: name → bound object (a
    :class:`~sc_core.MethodProxy`, or what verl's ``func_generator`` hook returned)."""

    def __init__(self, owner: object) -> None:
        self._owner = owner
        self._bound: dict[str, Any] = {}

    def __contains__(self, name: object) -> bool:
        return name in self._bound

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._bound))

    def __len__(self) -> int:
        return len(self._bound)

    def get(self, name: str) -> Any:
        """The object bound as ``name`` (``None`` if none is)."""
        return self._bound.get(name)

    def names(self) -> list[str]:
        """The bound names, sorted."""
        return sorted(self._bound)

    def bind(
        self, name: str, proxy: Any, *, source: type | None = None, replace: bool = False
    ) -> None:
        """Make ``proxy`` the owner's attribute ``name``; a name the owner already uses (an
        attribute of its class or instance, or a bound method unless ``replace``) is a
        :class:`~sc_core.MethodCollisionError` naming ``source``, the worker class."""
        owner = self._owner
        taken = name not in self._bound and (name in vars(owner) or hasattr(type(owner), name))
        if taken or (name in self._bound and not replace):
            where = f"worker class {source.__qualname__}" if source is not None else "spawn"
            kind = type(owner).__name__
            raise MethodCollisionError(
                f"{kind}._bind_worker_method: {where} registers a method named {name!r}, which "
                f"is already an attribute of the worker group ({kind}.{name}); rename the "
                "worker method"
            )
        setattr(owner, name, proxy)
        self._bound[name] = proxy

    def unbind_all(self) -> None:
        """Remove every bound method from the owner."""
        attributes = vars(self._owner)
        for name in self._bound:
            attributes.pop(name, None)
        self._bound = {}

    def bind_from(self, source: MethodTable, rebind: Callable[[Any, str], Any]) -> None:
        """Bind every method of ``source`` here, each through ``rebind(proxy, name)``."""
        for name, proxy in source._bound.items():
            self.bind(name, rebind(proxy, name))
