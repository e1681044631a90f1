"""``ResourcePoolManager``: named resource pools and the roles that run on them.

verl's trainer-side helper, backend-neutral: ``resource_pool_spec`` maps a pool name to its
process counts per node, ``mapping`` maps a role (any hashable: verl uses an enum) to a pool
name. :meth:`~ResourcePoolManager.create_resource_pool` checks that the backend can hold
the pools, then builds one pool per name; roles mapped to the same name share one pool
(and so, colocated, one set of worker processes).

A backend specialises two protected hooks: :meth:`~ResourcePoolManager._new_pool` builds
one pool of the backend's class (sc-ray: a ``RayResourcePool``), and
:meth:`~ResourcePoolManager._check_resource_available` fails fast when the cluster cannot
hold every pool (sc-ray: ``InsufficientResourcesError``). Used as is, the manager builds
plain :class:`~sc_core.ResourcePool` objects for the in-process backend, which needs no
devices and checks nothing.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from ._errors import ConfigTypeError, ResourcePoolError, UnknownRoleError
from ._resource import ResourcePool

__all__ = ["ResourcePoolManager"]

if TYPE_CHECKING:
    # The pool class a manager builds, for the type checker; it defaults to ResourcePool
    # (PEP 696) so that a bare ``ResourcePoolManager`` is the in-process manager.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    PoolT = _TypeVarWithDefault("PoolT", bound=ResourcePool, default=ResourcePool, covariant=True)
else:
    PoolT = TypeVar("PoolT", bound=ResourcePool, covariant=True)


class ResourcePoolManager(Generic[PoolT]):
    """Named pools (``resource_pool_spec``) and the pool of each role (``mapping``).

    ``ResourcePoolManager({"global_pool": [2], "critic_pool": [2]}, {Role.Actor:
    "global_pool", Role.Critic: "critic_pool"})`` describes two pools of two processes on
    one node each. A spec that is not a mapping of pool names to non-empty lists of positive
    process counts, or a mapping that names a pool the spec does not define, is a
    :class:`~sc_core.ResourcePoolError` at construction.

    :meth:`create_resource_pool` builds the pools (``max_colocate_count`` and
    ``n_gpus_per_node`` are given to each); :meth:`get_resource_pool` returns the pool of a
    role (an unmapped role is an :class:`~sc_core.UnknownRoleError`, a ``KeyError``);
    :meth:`get_n_gpus` counts the processes of all pools.

    Subclasses (a backend's manager) override :meth:`_new_pool` and
    :meth:`_check_resource_available`, set :attr:`pool_class` to the class ``_new_pool``
    builds (it is checked), and may set :attr:`error_class` to their own subclass of
    :class:`~sc_core.ResourcePoolError`.
    """

    #: The class of the pools :meth:`_new_pool` builds; :meth:`create_resource_pool` checks
    #: every pool against it.
    pool_class: ClassVar[type[ResourcePool]] = ResourcePool
    #: The error raised for a bad spec or a pool used before it is created.
    error_class: ClassVar[type[ResourcePoolError]] = ResourcePoolError

    def __init__(
        self,
        resource_pool_spec: Mapping[str, Sequence[int]],
        mapping: Mapping[Any, str],
        *,
        max_colocate_count: int = 1,
        n_gpus_per_node: int = 8,
    ) -> None:
        where = type(self).__name__
        self.resource_pool_spec: dict[str, list[int]] = self._check_spec(resource_pool_spec)
        if not isinstance(mapping, Mapping):
            raise ConfigTypeError(
                f"{where}: mapping must be a mapping of role to pool name, "
                f"got {type(mapping).__qualname__} {mapping!r}"
            )
        unknown: list[object] = []
        for pool_name in mapping.values():
            known = isinstance(pool_name, str) and pool_name in self.resource_pool_spec
            if not known and pool_name not in unknown:
                unknown.append(pool_name)
        if unknown:
            raise self.error_class(
                f"{where}: mapping names pools {unknown} that resource_pool_spec does not "
                f"define (defined: {sorted(self.resource_pool_spec)})"
            )
        self.mapping: dict[Any, str] = dict(mapping)
        for label, value in (
            ("max_colocate_count", max_colocate_count),
            ("n_gpus_per_node", n_gpus_per_node),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise self.error_class(f"{where}: {label} must be a positive int, got {value!r}")
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node
        self.resource_pool_dict: dict[str, PoolT] = {}

    def _check_spec(self, spec: Mapping[str, Sequence[int]]) -> dict[str, list[int]]:
        where = type(self).__name__
        if not isinstance(spec, Mapping):
            raise ConfigTypeError(
                f"{where}: resource_pool_spec must be a mapping of pool name to process "
                f"counts per node, got {type(spec).__qualname__} {spec!r}"
            )
        out: dict[str, list[int]] = {}
        for name, counts in spec.items():
            if not isinstance(name, str) or not name:
                raise self.error_class(
                    f"{where}: pool names must be non-empty str, got {type(name).__qualname__} "
                    f"{name!r}"
                )
            bad = (
                isinstance(counts, (str, bytes))
                or not isinstance(counts, Sequence)
                or not counts
                or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts)
            )
            if bad:
                raise self.error_class(
                    f"{where}: pool {name!r}: process_on_nodes must be a non-empty list of "
                    f"positive process counts per node, got {counts!r}"
                )
            out[name] = list(counts)
        return out

    # -- the backend hooks -------------------------------------------------------------------

    def _new_pool(self, name: str, process_on_nodes: list[int]) -> PoolT:
        """Build the pool ``name`` (not yet placed anywhere). The default builds a plain
        :class:`~sc_core.ResourcePool`; a backend whose manager is generic in its own pool
        class overrides this and sets :attr:`pool_class`."""
        pool = ResourcePool(
            process_on_nodes,
            max_colocate_count=self.max_colocate_count,
            n_gpus_per_node=self.n_gpus_per_node,
        )
        # Checked in create_resource_pool against pool_class, which a subclass that changes
        # the pool class must set together with this hook.
        return cast("PoolT", pool)

    def _check_resource_available(self) -> None:
        """Fail before any pool is built when the backend cannot hold them all. The
        in-process backend needs no devices: nothing to check."""

    # -- verl's API --------------------------------------------------------------------------

    def create_resource_pool(self) -> None:
        """Check the backend's capacity, then build every pool of the spec (once)."""
        self._check_resource_available()
        for name, counts in self.resource_pool_spec.items():
            pool = self._new_pool(name, list(counts))
            if not isinstance(pool, self.pool_class):
                raise ConfigTypeError(
                    f"{type(self).__name__}._new_pool({name!r}) built a "
                    f"{type(pool).__qualname__}, expected a {self.pool_class.__qualname__} "
                    "(set pool_class with _new_pool)"
                )
            self.resource_pool_dict[name] = pool

    def get_resource_pool(self, role: Hashable) -> PoolT:
        """The pool that ``role`` runs on (after :meth:`create_resource_pool`)."""
        where = type(self).__name__
        if role not in self.mapping:
            raise UnknownRoleError(
                f"{where}.get_resource_pool: role {role!r} has no pool (mapped roles: "
                f"{sorted(map(str, self.mapping))})"
            )
        name = self.mapping[role]
        pool = self.resource_pool_dict.get(name)
        if pool is None:
            raise self.error_class(
                f"{where}.get_resource_pool({role!r}): pool {name!r} is not created yet; "
                "call create_resource_pool first"
            )
        return pool

    def get_n_gpus(self) -> int:
        """The number of processes over all pools (one device each on an accelerator)."""
        return sum(sum(counts) for counts in self.resource_pool_spec.values())

    def release(self) -> None:
        """Release what the pools hold; in-process pools hold nothing (sc-ray removes the
        placement groups)."""

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(resource_pool_spec={self.resource_pool_spec}, "
            f"mapping={self.mapping}, created={sorted(self.resource_pool_dict)})"
        )
