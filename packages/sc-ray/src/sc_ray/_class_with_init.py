"""``RayClassWithInitArgs``: a worker class, its constructor arguments and its actor options."""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from sc_core import ClassWithInitArgs

from . import _ray_api as rapi
from ._errors import RayResourcePoolError, WorkerEnvError

__all__ = ["RayClassWithInitArgs", "merge_options"]

logger = logging.getLogger("sc_ray")

if TYPE_CHECKING:
    # The worker class, for the type checker only (sc-core's typed calls); it defaults to
    # ``Any`` (PEP 696) so that a bare ``RayClassWithInitArgs`` stays valid.
    from typing_extensions import TypeVar as _TypeVarWithDefault

    W = _TypeVarWithDefault("W", default=Any)
else:
    W = TypeVar("W")

_DEVICE_RESOURCE = {"cuda": "GPU", "gpu": "GPU", "npu": "NPU"}


def merge_options(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """Ray actor options ``base`` updated with ``extra``; ``runtime_env`` and its
    ``env_vars``, and ``resources``, are merged key by key instead of replaced."""
    out = copy.deepcopy(dict(base))
    for key, value in extra.items():
        if key == "runtime_env" and isinstance(value, Mapping):
            env = dict(out.get("runtime_env") or {})
            for env_key, env_value in value.items():
                if env_key == "env_vars" and isinstance(env_value, Mapping):
                    env["env_vars"] = {**dict(env.get("env_vars") or {}), **dict(env_value)}
                else:
                    env[env_key] = copy.deepcopy(env_value)
            out["runtime_env"] = env
        elif key == "resources" and isinstance(value, Mapping):
            out["resources"] = {**dict(out.get("resources") or {}), **dict(value)}
        else:
            out[key] = copy.deepcopy(value)
    return out


class RayClassWithInitArgs(ClassWithInitArgs[Any], Generic[W]):
    """A worker class (plain or ``ray.remote``-wrapped) with its constructor arguments and
    the Ray options its actors are created with.

    :meth:`update_options` merges Ray actor options (a ``runtime_env`` is merged with the
    one the worker group adds, never replaced); :meth:`set_additional_resource` adds custom
    resources, any number of keys. Calling the object creates one actor on a placement-group
    bundle, or, with ``sharing_with``, on the node of another actor and with its visible
    devices.
    """

    def __init__(self, cls: Callable[..., W], *args: Any, **kwargs: Any) -> None:
        super().__init__(cls, *args, **kwargs)
        self._options: dict[str, Any] = {}
        self._additional_resource: dict[str, float] = {}

    @property
    def worker_cls(self) -> type:
        """The Python class the actors run (``cls`` unwrapped from ``ray.remote``)."""
        return rapi.unwrap_remote_class(self.cls)

    def set_additional_resource(self, additional_resource: Mapping[str, float]) -> None:
        """Custom Ray resources each actor asks for (``{"my_resource": 1}``)."""
        if not isinstance(additional_resource, Mapping):
            raise RayResourcePoolError(
                f"set_additional_resource: expected a mapping of resource name to amount, "
                f"got {type(additional_resource).__qualname__} {additional_resource!r}"
            )
        for key, amount in additional_resource.items():
            if not isinstance(key, str) or isinstance(amount, bool):
                raise RayResourcePoolError(
                    f"set_additional_resource: bad entry {key!r}: {amount!r}; "
                    "give resource names and numbers"
                )
            if not isinstance(amount, (int, float)) or amount < 0:
                raise RayResourcePoolError(
                    f"set_additional_resource: resource {key!r} needs a non-negative amount, "
                    f"got {amount!r}"
                )
        self._additional_resource = {k: float(v) for k, v in additional_resource.items()}

    def update_options(self, options: Mapping[str, Any]) -> None:
        """Merge Ray actor options (``runtime_env``, ``max_concurrency``, ``num_cpus``, ...)."""
        if not isinstance(options, Mapping):
            raise RayResourcePoolError(
                f"update_options: expected a mapping of Ray actor options, got {options!r}"
            )
        self._options = merge_options(self._options, options)

    @property
    def options(self) -> dict[str, Any]:
        """A copy of the Ray actor options set so far."""
        return copy.deepcopy(self._options)

    def actor_options(
        self,
        placement_group: rapi.PlacementGroup | None,
        placement_group_bundle_idx: int,
        use_gpu: bool = True,
        num_gpus: float = 1,
        sharing_with: rapi.ActorHandle | None = None,
        device_name: str = "cuda",
        *,
        num_cpus: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        name: str | None = None,
        lifetime: str | None = None,
        share_timeout_s: float | None = 60.0,
    ) -> dict[str, Any]:
        """The Ray options one actor is created with (see :meth:`__call__`)."""
        options: dict[str, Any] = {}
        group_env = dict(env_vars or {})
        if sharing_with is not None:
            node_id, devices = rapi.actor_node_and_devices(sharing_with, share_timeout_s)
            options["scheduling_strategy"] = rapi.node_affinity(node_id, soft=False)
            if devices is not None:
                group_env["CUDA_VISIBLE_DEVICES"] = devices
        elif placement_group is not None:
            options["scheduling_strategy"] = rapi.placement_strategy(
                placement_group, placement_group_bundle_idx
            )
        if num_cpus is not None:
            options["num_cpus"] = num_cpus
        if use_gpu and sharing_with is None and device_name.lower() != "cpu":
            resource = _DEVICE_RESOURCE.get(device_name.lower(), "GPU")
            if resource == "GPU":
                options["num_gpus"] = num_gpus
            else:
                options["resources"] = {resource: num_gpus}
        if self._additional_resource:
            options = merge_options(options, {"resources": self._additional_resource})
        # The user's options win over sc-ray's defaults, except that the environment the
        # worker group sets is added to (never replaced by) the user's runtime_env.
        options = merge_options(options, self._options)
        if group_env:
            user_env = dict((options.get("runtime_env") or {}).get("env_vars") or {})
            clash = sorted(k for k in group_env if k in user_env and user_env[k] != group_env[k])
            if clash and sharing_with is None:
                raise WorkerEnvError(
                    f"{self.worker_cls.__qualname__}: runtime_env env_vars set {clash}, which "
                    f"the worker group sets itself ({ {k: group_env[k] for k in clash} })"
                )
            options = merge_options(options, {"runtime_env": {"env_vars": group_env}})
        if name is not None:
            options["name"] = name
        if lifetime is not None:
            options["lifetime"] = lifetime
        return options

    def __call__(
        self,
        placement_group: rapi.PlacementGroup | None = None,
        placement_group_bundle_idx: int = 0,
        use_gpu: bool = True,
        num_gpus: float = 1,
        sharing_with: rapi.ActorHandle | None = None,
        device_name: str = "cuda",
        *,
        num_cpus: float | None = None,
        env_vars: Mapping[str, str] | None = None,
        name: str | None = None,
        lifetime: str | None = None,
    ) -> rapi.ActorHandle:
        """Create one actor of the class on bundle ``placement_group_bundle_idx`` of
        ``placement_group`` (or, with ``sharing_with``, on that actor's node and visible
        devices) and return its handle; the constructor runs asynchronously. With
        ``use_gpu`` the actor asks ``num_gpus`` of the ``device_name`` accelerator (``GPU``
        for ``"cuda"``, ``NPU`` for ``"npu"``; nothing for ``"cpu"``, as in verl)."""
        options = self.actor_options(
            placement_group,
            placement_group_bundle_idx,
            use_gpu,
            num_gpus,
            sharing_with,
            device_name,
            num_cpus=num_cpus,
            env_vars=env_vars,
            name=name,
            lifetime=lifetime,
        )
        return rapi.create_actor(rapi.remote_class(self.cls), options, self.args, self.kwargs)

    def __repr__(self) -> str:
        name = getattr(self.worker_cls, "__qualname__", repr(self.cls))
        return f"RayClassWithInitArgs({name}, options={self._options!r})"
