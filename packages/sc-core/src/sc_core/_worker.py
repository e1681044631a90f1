"""``Worker``: the base class of every worker (verl's ``Worker``)."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, TypeVar

from sc_dispatch import Dispatch, Execute, register
from sc_dispatch._setting import SettingValueError

from ._call_ids import CallRecord, CallState, JournaledCall
from ._context import (
    MASTER_KEYS,
    Rendezvous,
    _skip_rendezvous,
    current_worker_context,
    rendezvous_from_env,
    worker_environ,
)
from ._errors import (
    ConfigTypeError,
    MeshRegistrationError,
    MethodCollisionError,
    MissingEnvironmentError,
    RendezvousError,
    UnknownMeshError,
    VisibleDevicesError,
    WorkerEnvironmentError,
)
from ._faults import ArmedFault
from ._journal import await_journaled, journaled_calls, last_calls
from ._ports import free_port
from ._settings import RENDEZVOUS_TIMEOUT

__all__ = [
    "RESERVED_WORKER_ATTRS",
    "DistGlobalInfo",
    "DistRankInfo",
    "Worker",
    "WorkerHelper",
    "normalize_visible_devices",
]

#: Names a ``Worker`` subclass may not define: the worker group calls the first three on
#: every worker, and ``Worker.__init__`` assigns the others as instance attributes (verl's
#: names), which would silently hide a method of that name. Every name starting with
#: ``_sc_`` is reserved as well (sc's own state and hooks live there).
RESERVED_WORKER_ATTRS = frozenset(
    {
        "_query_dispatch_info",
        "_query_collect_info",
        "_query_receives_data_info",
        "_fuw_execute",
        "fused_worker_dict",
        "_rank",
        "_world_size",
        "_local_rank",
        "_local_world_size",
        "_master_addr",
        "_master_port",
        "_cuda_visible_devices",
    }
)
RESERVED_WORKER_PREFIX = "_sc_"

T = TypeVar("T")
W = TypeVar("W", bound="Worker")


@dataclass
class DistRankInfo:
    """A worker's coordinates in a tensor x data x pipeline x context parallel layout."""

    tp_rank: int
    dp_rank: int
    pp_rank: int
    cp_rank: int


@dataclass
class DistGlobalInfo:
    """The sizes of a tensor x data x pipeline x context parallel layout."""

    tp_size: int
    dp_size: int
    pp_size: int
    cp_size: int


def normalize_visible_devices(env: MutableMapping[str, str], where: str = "Worker") -> None:
    """Fold ``HIP_VISIBLE_DEVICES`` and ``ROCR_VISIBLE_DEVICES`` into ``CUDA_VISIBLE_DEVICES``.

    HIP and CUDA name the same devices; both set to different values is an error, otherwise
    HIP's value moves to CUDA. ROCR filters devices *before* HIP/CUDA do, so ROCR together
    with either is an error; ROCR alone moves to CUDA. ``env`` is checked before it is
    changed, so a :class:`~sc_core.VisibleDevicesError` leaves it untouched.
    """
    cuda = env.get("CUDA_VISIBLE_DEVICES") or None
    hip = env.get("HIP_VISIBLE_DEVICES") or None
    rocr = env.get("ROCR_VISIBLE_DEVICES") or None
    if hip and cuda and hip != cuda:
        raise VisibleDevicesError(
            f"{where}: HIP_VISIBLE_DEVICES={hip!r} and CUDA_VISIBLE_DEVICES={cuda!r} disagree; "
            "set one of them, or both to the same value"
        )
    if rocr and (hip or cuda):
        raise VisibleDevicesError(
            f"{where}: ROCR_VISIBLE_DEVICES={rocr!r} is set together with "
            f"{'HIP' if hip else 'CUDA'}_VISIBLE_DEVICES={hip or cuda!r}; set only one"
        )
    if hip:
        del env["HIP_VISIBLE_DEVICES"]
        env["CUDA_VISIBLE_DEVICES"] = hip
    if rocr:
        del env["ROCR_VISIBLE_DEVICES"]
        env["CUDA_VISIBLE_DEVICES"] = rocr


def _env_int(
    env: Mapping[str, str], name: str, where: str, *, default: int | None = None, minimum: int = 0
) -> int:
    raw = env.get(name)
    if raw is None:
        if default is None:
            raise MissingEnvironmentError(
                f"{where}: {name} is not set in the worker's environment; a worker group sets "
                "WORLD_SIZE and RANK for each worker (construct workers through one)"
            )
        return default
    try:
        value = int(raw)
    except ValueError:
        raise WorkerEnvironmentError(f"{where}: {name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise WorkerEnvironmentError(f"{where}: {name} must be >= {minimum}, got {value}")
    return value


class WorkerHelper:
    """Helpers a worker uses to pick its group's rendezvous address."""

    @staticmethod
    def _get_node_ip() -> str:
        """This node's IP address (loopback when the host name does not resolve)."""
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            return "127.0.0.1"

    @staticmethod
    def _get_free_port() -> int:
        """A TCP port free on this node now (verl's name of :func:`sc_core.backend.free_port`)."""
        return free_port()

    def get_availale_master_addr_port(self) -> tuple[str, str]:
        """verl's (misspelt) name of :meth:`get_available_master_addr_port`."""
        return self.get_available_master_addr_port()

    def get_available_master_addr_port(self) -> tuple[str, str]:
        """This node's address and a free port, as strings."""
        return self._get_node_ip().strip("[]"), str(self._get_free_port())

    def _get_pid(self) -> int:
        return os.getpid()


class Worker(WorkerHelper):
    """Base class of worker classes run by a worker group.

    Construction reads WORLD_SIZE and RANK (required), LOCAL_WORLD_SIZE and LOCAL_RANK
    (default 1 and 0), MASTER_ADDR and MASTER_PORT (``None`` when unset) from the worker's
    environment: the process environment on Ray, a mapping of its own in the in-process
    backend (read it with :func:`sc_core.worker_environ`). Before ``__init__`` runs, rank 0
    publishes MASTER_ADDR/MASTER_PORT through the group's rendezvous and the other ranks
    receive them.

    A subclass may name its methods anything (``env``, ``rank``, ``config``, ...) except the
    names in :data:`RESERVED_WORKER_ATTRS` and names starting with ``_sc_``: defining one
    is a :class:`~sc_core.MethodCollisionError` when the class is created. The framework's
    own state lives under those names, so a user's ``rank`` method replaces only the
    ``rank`` property, never what the group relies on.
    """

    fused_worker_attr_name = "fused_worker_dict"
    _sc_env: MutableMapping[str, str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("_sc_framework_class", False):
            return  # sc's own generated classes (colocated, fused, actor wrappers)
        taken = sorted(
            name
            for name in cls.__dict__
            if name in RESERVED_WORKER_ATTRS
            or (name.startswith(RESERVED_WORKER_PREFIX) and not name.startswith("__"))
        )
        if taken:
            raise MethodCollisionError(
                f"worker class {cls.__qualname__} defines {taken}, which "
                f"{'is a name' if len(taken) == 1 else 'are names'} sc-core reserves for the "
                f"framework (sc_core.ext.RESERVED_WORKER_ATTRS, and every name starting with "
                f"{RESERVED_WORKER_PREFIX!r}); rename {'it' if len(taken) == 1 else 'them'}"
            )

    def __new__(cls: type[W], *args: Any, **kwargs: Any) -> W:
        instance = super().__new__(cls)
        ctx = current_worker_context()
        env = ctx.env if ctx is not None else os.environ
        instance._sc_env = env
        if not _skip_rendezvous.get() and env.get("RANK") is not None:
            rendezvous = ctx.rendezvous if ctx is not None else None
            if rendezvous is None:
                rendezvous = rendezvous_from_env(env)
            if rendezvous is not None:
                rank = _env_int(env, "RANK", f"{cls.__qualname__}.__new__")
                instance._sc_configure_before_init(rendezvous, rank)
        return instance

    def _sc_configure_before_init(self, rendezvous: Rendezvous, rank: int) -> None:
        """Rank 0 publishes MASTER_ADDR/MASTER_PORT; other ranks wait for them."""
        env = self._sc_environ()
        if rank == 0:
            addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
            if not addr or not port:
                addr, port = self.get_availale_master_addr_port()
                env["MASTER_ADDR"], env["MASTER_PORT"] = addr, port
            rendezvous.publish({"MASTER_ADDR": addr, "MASTER_PORT": port})
            return
        if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
            return
        try:
            timeout = RENDEZVOUS_TIMEOUT.get(env)
        except SettingValueError as exc:
            raise SettingValueError(f"{type(self).__qualname__} (rank {rank}): {exc}") from None
        info = rendezvous.wait(timeout)
        missing = [k for k in MASTER_KEYS if not info.get(k)]
        if missing:
            raise RendezvousError(
                f"{type(self).__qualname__} (rank {rank}): rank 0 published {info}, "
                f"without {missing}"
            )
        for key in MASTER_KEYS:
            env[key] = info[key]

    def __init__(self, cuda_visible_devices: str | None = None) -> None:
        env = self._sc_environ()
        where = f"{type(self).__qualname__}.__init__"
        normalize_visible_devices(env, where)
        world_size = _env_int(env, "WORLD_SIZE", where, minimum=1)
        rank = _env_int(env, "RANK", where)
        if rank >= world_size:
            raise WorkerEnvironmentError(
                f"{where}: RANK={rank} is not below WORLD_SIZE={world_size}"
            )
        local_world_size = _env_int(env, "LOCAL_WORLD_SIZE", where, default=1, minimum=1)
        local_rank = _env_int(env, "LOCAL_RANK", where, default=0)
        if local_rank >= local_world_size:
            raise WorkerEnvironmentError(
                f"{where} (rank {rank}): LOCAL_RANK={local_rank} is not below "
                f"LOCAL_WORLD_SIZE={local_world_size}"
            )
        self._rank = rank
        self._world_size = world_size
        self._local_rank = local_rank
        self._local_world_size = local_world_size
        self._master_addr: str | None = env.get("MASTER_ADDR")
        self._master_port: str | None = env.get("MASTER_PORT")
        self._cuda_visible_devices = cuda_visible_devices
        env.setdefault("LOCAL_WORLD_SIZE", str(local_world_size))
        env.setdefault("LOCAL_RANK", str(local_rank))
        self.fused_worker_dict: dict[str, Any] = {}
        self._sc_mesh_dp_rank: dict[str, int] = {}
        self._sc_mesh_collect: dict[str, bool] = {}
        self._sc_mesh_receives_data: dict[str, bool] = {}

    # --- replacement (see _replace.py) -----------------------------------------------------

    def on_group_reformed(self, replaced: list[int]) -> None:
        """Hook: the group replaced the workers of ``replaced`` and re-forms its collective
        state; runs on every rank, the new ones included, after MASTER_ADDR/MASTER_PORT in
        this worker's environment (and :meth:`get_master_addr_port`) were set to the new
        rendezvous address. Its registered dispatch meshes stay (they depend on the rank
        only; the group reads every rank's tables again).

        A worker that uses torch.distributed overrides it to destroy its process groups and
        drop what was built on them (sharded models, meshes, communicators), so that the
        group's set-up method, called again by the driver, starts clean. It must do nothing
        harmful on a new worker that has set nothing up. The default does nothing.
        """
        return None

    def _sc_reform(
        self, master_addr: str | None, master_port: str | None, replaced: tuple[int, ...]
    ) -> None:
        """sc-core's side of a replacement on this rank, then :meth:`on_group_reformed`
        (on every role instance of a colocated or fused worker too)."""
        env = self._sc_environ()
        for key, value in (("MASTER_ADDR", master_addr), ("MASTER_PORT", master_port)):
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        self._master_addr, self._master_port = master_addr, master_port
        roles = {**getattr(self, "worker_dict", {}), **self.fused_worker_dict}
        for role in roles.values():
            if isinstance(role, Worker) and role is not self:
                role._sc_reform(master_addr, master_port, replaced)
        self.on_group_reformed(list(replaced))

    # --- injected faults (see _faults.py) ----------------------------------------------------

    def _sc_arm_fault(self, rank: int, fault: ArmedFault) -> None:
        """Arm ``fault`` if this worker is ``rank`` (every rank of a group is asked)."""
        if self._rank == rank:
            self.__dict__.setdefault("_sc_armed_faults", {})[fault.method] = fault

    def _sc_take_fault(self, method: str) -> ArmedFault | None:
        """The fault armed for ``method``, disarmed (a backend asks as a method starts)."""
        armed: dict[str, ArmedFault] | None = self.__dict__.get("_sc_armed_faults")
        return armed.pop(method, None) if armed else None

    # --- call ids (see _journal.py) ------------------------------------------------------------

    def _sc_last_calls(self) -> dict[str, CallRecord]:
        """Per method, the last call with an id this worker completed
        (``WorkerGroup.last_calls`` asks every rank)."""
        return last_calls(self)

    def _sc_journal_calls(self, scopes: frozenset[int] | None = None) -> list[JournaledCall]:
        """Every call with an id this worker holds, running or finished, of ``scopes``
        (``WorkerGroup.journaled_calls`` and ``adopt_journals`` ask every rank, on the
        control lane)."""
        return journaled_calls(self, scopes)

    def _sc_await_call(self, scope: int, key: str, timeout: float | None) -> CallState | None:
        """Wait until the call ``(scope, key)`` has reached this worker, at most ``timeout``
        seconds; its state, or ``None`` (an injected torn dispatch waits so, on the control
        lane)."""
        return await_journaled(self, scope, key, timeout)

    # --- identity --------------------------------------------------------------------------

    def _sc_environ(self) -> MutableMapping[str, str]:
        """This worker's environment: ``os.environ`` on Ray, its own mapping in-process."""
        env: MutableMapping[str, str] | None = self.__dict__.get("_sc_env")
        return env if env is not None else worker_environ()

    @classmethod
    def env_keys(cls) -> list[str]:
        """The environment variables a worker reads at construction."""
        return [
            "WORLD_SIZE",
            "RANK",
            "LOCAL_WORLD_SIZE",
            "LOCAL_RANK",
            "MASTER_ADDR",
            "MASTER_PORT",
        ]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        """MASTER_ADDR and MASTER_PORT as this worker saw them at construction."""
        return self._master_addr, self._master_port

    def get_cuda_visible_devices(self) -> str:
        """``CUDA_VISIBLE_DEVICES`` of this worker's environment, or ``"not set"``."""
        return self._sc_environ().get("CUDA_VISIBLE_DEVICES", "not set")

    def get_fused_worker_by_name(self, worker_name: str) -> Any:
        """The role instance ``worker_name`` of a fused worker, or ``None``."""
        return self.__dict__.get("fused_worker_dict", {}).get(worker_name)

    # --- mesh registration -------------------------------------------------------------------

    def _sc_mesh_tables(self) -> tuple[dict[str, int], dict[str, bool]]:
        # setdefault: a subclass whose __init__ skipped Worker.__init__ can still register.
        return (
            self.__dict__.setdefault("_sc_mesh_dp_rank", {}),
            self.__dict__.setdefault("_sc_mesh_collect", {}),
        )

    def _sc_mesh_receives_table(self) -> dict[str, bool]:
        table: dict[str, bool] = self.__dict__.setdefault("_sc_mesh_receives_data", {})
        return table

    def _sc_rank_text(self) -> str:
        rank = self.__dict__.get("_rank")
        return f"rank {rank}" if rank is not None else "rank unknown"

    def _register_dispatch_collect_info(
        self, mesh_name: str, dp_rank: int, is_collect: bool, receives_data: bool = True
    ) -> None:
        """Declare this worker's dp rank on ``mesh_name``, whether its output is collected,
        and whether it reads the batch: a rank registered with ``receives_data=False`` (a
        middle pipeline stage, which gets its activations from the previous stage) receives
        its dp shard's metadata only -- for a DataProto, one with the same ``meta_info`` and
        row count and no columns. Every dp group needs at least one rank that receives the
        data (checked on the driver). ``receives_data`` that is not a ``bool`` is a
        :class:`~sc_core.ConfigTypeError`."""
        where = (
            f"{type(self).__qualname__}._register_dispatch_collect_info ({self._sc_rank_text()})"
        )
        if not isinstance(mesh_name, str) or not mesh_name:
            raise MeshRegistrationError(
                f"{where}: mesh_name must be a non-empty str, got {mesh_name!r}"
            )
        if isinstance(dp_rank, bool) or not isinstance(dp_rank, int) or dp_rank < 0:
            raise MeshRegistrationError(
                f"{where}: dp_rank for mesh {mesh_name!r} must be an int >= 0, got {dp_rank!r}"
            )
        if not isinstance(is_collect, bool):
            raise MeshRegistrationError(
                f"{where}: is_collect for mesh {mesh_name!r} must be a bool, got {is_collect!r}"
            )
        if not isinstance(receives_data, bool):
            raise ConfigTypeError(
                f"{where}: receives_data for mesh {mesh_name!r} must be a bool, got "
                f"{type(receives_data).__qualname__} {receives_data!r}"
            )
        dp_table, collect_table = self._sc_mesh_tables()
        if mesh_name in dp_table:
            raise MeshRegistrationError(
                f"{where}: mesh {mesh_name!r} is already registered (dp_rank "
                f"{dp_table[mesh_name]}, is_collect {collect_table[mesh_name]})"
            )
        dp_table[mesh_name] = dp_rank
        collect_table[mesh_name] = is_collect
        self._sc_mesh_receives_table()[mesh_name] = receives_data

    def _sc_lookup_mesh(self, table: Mapping[str, T], mesh_name: str, method: str) -> T:
        if mesh_name not in table:
            raise UnknownMeshError(
                f"{type(self).__qualname__}.{method} ({self._sc_rank_text()}): mesh {mesh_name!r} "
                f"was never registered; registered meshes: {sorted(table)}"
            )
        return table[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This worker's dp rank on ``mesh_name``; a mesh it never registered is an
        :class:`~sc_core.UnknownMeshError` (a ``KeyError``) naming the mesh, this rank and the
        meshes it did register (on the driver, a :class:`~sc_core.WorkerError` that is also an
        ``UnknownMeshError``)."""
        return self._sc_lookup_mesh(self._sc_mesh_tables()[0], mesh_name, "_query_dispatch_info")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this worker's output is collected on ``mesh_name``; a mesh it never
        registered is an :class:`~sc_core.UnknownMeshError`, as in :meth:`_query_dispatch_info`."""
        return self._sc_lookup_mesh(self._sc_mesh_tables()[1], mesh_name, "_query_collect_info")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_receives_data_info(self, mesh_name: str) -> bool:
        """Whether this worker receives its dp shard's data on ``mesh_name`` (``False``: its
        metadata only); a mesh it never registered is an :class:`~sc_core.UnknownMeshError`,
        as in :meth:`_query_dispatch_info`."""
        self._sc_lookup_mesh(self._sc_mesh_tables()[0], mesh_name, "_query_receives_data_info")
        return self._sc_mesh_receives_table().get(mesh_name, True)

    def query_collect_info(self, mesh_name: str) -> bool:
        """Whether this worker's output is collected on ``mesh_name`` (called in the worker);
        a mesh never registered is an :class:`~sc_core.UnknownMeshError`."""
        return self._sc_lookup_mesh(self._sc_mesh_tables()[1], mesh_name, "query_collect_info")

    def get_dispatch_collect(self) -> dict[str, dict[str, Any]]:
        """Every registered mesh, as verl returns it: ``{"dispatch_dp_rank": {mesh: dp_rank},
        "collect_dp_rank": {mesh: is_collect}}``, plus sc's ``"receives_data": {mesh:
        receives_data}`` (copies). Give it to another worker's :meth:`set_dispatch_collect`
        with ``**`` to adopt this worker's layout."""
        dp_table, collect_table = self._sc_mesh_tables()
        receives = self._sc_mesh_receives_table()
        return {
            "dispatch_dp_rank": dict(dp_table),
            "collect_dp_rank": dict(collect_table),
            "receives_data": {mesh: receives.get(mesh, True) for mesh in dp_table},
        }

    def set_dispatch_collect(
        self,
        mesh_name: str,
        dispatch_dp_rank: Mapping[str, int],
        collect_dp_rank: Mapping[str, bool],
        receives_data: Mapping[str, bool] | None = None,
    ) -> None:
        """Register ``mesh_name`` with another worker's layout, from the tables of its
        :meth:`get_dispatch_collect` (``w.set_dispatch_collect("ref",
        **other.get_dispatch_collect())``): the tables' entry for ``mesh_name`` if present,
        else their single entry. Tables with several other meshes are ambiguous (verl takes
        the last one; sc raises :class:`~sc_core.MeshRegistrationError`), and so is a mesh
        this worker has registered already. Without ``receives_data`` (verl's two tables)
        the worker receives the data."""
        where = f"{type(self).__qualname__}.set_dispatch_collect ({self._sc_rank_text()})"

        def pick(table: Mapping[str, T], label: str) -> T:
            if mesh_name in table:
                return table[mesh_name]
            if len(table) == 1:
                return next(iter(table.values()))
            raise MeshRegistrationError(
                f"{where}: {label} has no entry for mesh {mesh_name!r} and not exactly one "
                f"entry to take instead (keys {sorted(table)})"
            )

        self._register_dispatch_collect_info(
            mesh_name,
            pick(dispatch_dp_rank, "dispatch_dp_rank"),
            pick(collect_dp_rank, "collect_dp_rank"),
            True if receives_data is None else pick(receives_data, "receives_data"),
        )

    # --- generic remote execution ---------------------------------------------------------

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(
        self, func: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Any:
        """Run ``func(self, *shard_args, **shard_kwargs)`` on every rank's shard."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``func(*args, **kwargs)`` on rank 0."""
        return func(*args, **kwargs)
