"""``DynamicEnum``: enums whose members can be added at run time, and ``Dispatch``/``Execute``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar, NewType, TypeVar

from ._errors import (
    DispatchModeExistsError,
    DispatchModeTypeError,
    InvalidDispatchModeError,
    UnknownDispatchModeError,
)

__all__ = [
    "CollectsList",
    "CollectsResult",
    "Dispatch",
    "DynamicEnum",
    "Execute",
    "PerRankCollectsList",
]

_E = TypeVar("_E", bound="DynamicEnum")


class _DynamicEnumMeta(type):
    """Lets a ``DynamicEnum`` subclass be iterated, indexed by name and tested with ``in``."""

    _registry: dict[str, DynamicEnum]

    def __iter__(cls) -> Iterator[Any]:
        return iter(list(cls._registry.values()))

    def __contains__(cls, item: object) -> bool:
        if isinstance(item, str):
            return item in cls._registry
        return isinstance(item, DynamicEnum) and cls._registry.get(item.name) is item

    def __getitem__(cls, name: str) -> Any:
        try:
            return cls._registry[name]
        except (KeyError, TypeError):
            raise UnknownDispatchModeError(
                f"{cls.__name__} has no member {name!r}; known: {sorted(cls._registry)}"
            ) from None

    def __len__(cls) -> int:
        return len(cls._registry)

    def names(cls) -> list[str]:
        """The member names, in registration order."""
        return list(cls._registry)

    def values(cls) -> list[Any]:
        """The members, in registration order (verl's name: they are the enum's values)."""
        return list(cls._registry.values())


def _member(cls: type[_E], name: str) -> _E:
    """Unpickling: the member ``name`` of ``cls`` in this process (the same object)."""
    member: _E = cls[name]
    return member


class DynamicEnum(metaclass=_DynamicEnumMeta):
    """An enum whose members are registered at run time (verl's ``DynamicEnum``).

    Each subclass keeps its own registry, with values counting from 0. Member names are
    upper-cased when registered. Members are singletons (also after pickling), compare by
    identity, and are reachable as class attributes (``Dispatch.ONE_TO_ALL``), by
    ``Cls["NAME"]`` (exact name; :class:`~sc_dispatch.UnknownDispatchModeError`, a
    ``KeyError``, when missing) and by ``Cls.from_name("name")`` (any case; ``None`` when
    missing). ``Cls.names()`` and ``Cls.values()`` list them; ``in`` and iteration work on
    the class.
    """

    _registry: ClassVar[dict[str, DynamicEnum]] = {}
    _next_value: ClassVar[int] = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._registry = {}
        cls._next_value = 0

    def __init__(self, name: str, value: int) -> None:
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self) -> tuple[Any, tuple[Any, str]]:
        # Pickles as a lookup, so a member stays a singleton across processes.
        return (_member, (type(self), self.name))

    @classmethod
    def register(cls: type[_E], name: str) -> _E:
        """Add a member called ``name.upper()`` and return it; a taken name is a
        :class:`~sc_dispatch.DispatchModeExistsError` (a ``ValueError``)."""
        if not isinstance(name, str):
            raise DispatchModeTypeError(
                f"{cls.__name__}.register: member name must be a str, "
                f"got {type(name).__qualname__} {name!r}"
            )
        key = name.upper()
        if not key.isidentifier():
            raise InvalidDispatchModeError(
                f"{cls.__name__}.register: member name must be an identifier, got {name!r}"
            )
        if key in cls._registry:
            raise DispatchModeExistsError(f"{cls.__name__}.register: member {key!r} already exists")
        if hasattr(cls, key):
            # A member is a class attribute: it must not hide a method or private state.
            raise InvalidDispatchModeError(
                f"{cls.__name__}.register: member name {key!r} would shadow the class "
                "attribute of that name; choose another name"
            )
        member = cls(key, cls._next_value)
        cls._next_value += 1
        cls._registry[key] = member
        setattr(cls, key, member)
        return member

    @classmethod
    def remove(cls: type[_E], name: str) -> _E:
        """Remove the member called ``name`` (any case) and return it; a missing one is a
        :class:`~sc_dispatch.UnknownDispatchModeError` (a ``KeyError``)."""
        key = name.upper() if isinstance(name, str) else name
        member = cls._registry.pop(key, None)
        if member is None:
            raise UnknownDispatchModeError(
                f"{cls.__name__}.remove: no member {name!r}; known: {sorted(cls._registry)}"
            )
        delattr(cls, key)
        # The registry holds the members of exactly ``cls``, typed as the base class.
        return member  # type: ignore[return-value]

    @classmethod
    def from_name(cls: type[_E], name: str) -> _E | None:
        """The member called ``name`` (any case), or ``None`` if there is none (as in verl)."""
        member = cls._registry.get(name.upper()) if isinstance(name, str) else None
        return member  # type: ignore[return-value]  # a member of ``cls``, as above


class Dispatch(DynamicEnum):
    """How a call's arguments are split across workers and how outputs are joined.

    For the type checker each predefined member also says what a driver-side call of a
    method registered with it returns (see :data:`CollectsList`, :data:`CollectsResult`,
    :data:`PerRankCollectsList`); at run time every member is a plain ``Dispatch``.
    """

    RANK_ZERO: ClassVar[CollectsResult]
    ONE_TO_ALL: ClassVar[CollectsList]
    ALL_TO_ALL: ClassVar[PerRankCollectsList]
    DP_COMPUTE: ClassVar[PerRankCollectsList]
    DP_COMPUTE_PROTO: ClassVar[CollectsResult]
    DP_COMPUTE_PROTO_WITH_FUNC: ClassVar[CollectsResult]
    DP_COMPUTE_PROTO_BALANCED: ClassVar[CollectsResult]
    DP_COMPUTE_METRIC: ClassVar[CollectsList]
    DIRECT_ROLLOUT_METHOD: ClassVar[Dispatch]


#: A dispatch mode whose driver-side call takes the worker method's own arguments and
#: returns the list of every rank's result (``list[R]``): ``ONE_TO_ALL``,
#: ``DP_COMPUTE_METRIC``. A static marker only (``typing.NewType``): wrap a custom member,
#: ``CollectsList(register_dispatch_mode(...))``, to declare the same of it.
CollectsList = NewType("CollectsList", Dispatch)

#: A dispatch mode whose driver-side call takes the worker method's own arguments and
#: returns a value of the method's return type ``R`` (the joined batch, or rank 0's value):
#: ``RANK_ZERO``, ``DP_COMPUTE_PROTO``, ``DP_COMPUTE_PROTO_WITH_FUNC``. A static marker only.
CollectsResult = NewType("CollectsResult", Dispatch)

#: A dispatch mode whose driver-side arguments are per-rank lists rather than the worker
#: method's own arguments (so they are not checked), and that returns ``list[R]``:
#: ``ALL_TO_ALL``, ``DP_COMPUTE``. A static marker only.
PerRankCollectsList = NewType("PerRankCollectsList", Dispatch)


class Execute(DynamicEnum):
    """Which workers run a call."""

    ALL: ClassVar[Execute]
    RANK_ZERO: ClassVar[Execute]


for _name in (
    "RANK_ZERO",
    "ONE_TO_ALL",
    "ALL_TO_ALL",
    "DP_COMPUTE",
    "DP_COMPUTE_PROTO",
    "DP_COMPUTE_PROTO_WITH_FUNC",
    "DP_COMPUTE_METRIC",
    "DIRECT_ROLLOUT_METHOD",
    "DP_COMPUTE_PROTO_BALANCED",
):
    Dispatch.register(_name)
for _name in ("ALL", "RANK_ZERO"):
    Execute.register(_name)
