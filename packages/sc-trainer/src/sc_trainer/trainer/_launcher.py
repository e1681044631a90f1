"""What the trainer needs to build its workers on one backend: the :class:`Launcher`
protocol (its implementations, for Ray and for this process, are in
:mod:`sc_trainer.launch`)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, TypeVar

from sc_core import ClassWithInitArgs, ResourcePool, ResourcePoolManager, Worker, WorkerGroup

from ..runs import AttachedDriver

__all__ = ["Launcher"]

W = TypeVar("W")


class Launcher(Protocol):
    """What the trainer needs to build its workers on one backend: verl's pieces, typed by
    the worker class. ``name`` is the backend's (``TrainerConfig.backend``); ``driver``
    the detached run's call ids and run state while it runs (``None``: not detached)."""

    name: str
    driver: AttachedDriver | None

    def running(self) -> contextlib.AbstractContextManager[None]:
        """Start what the backend needs (a Ray cluster) for the ``with`` block."""

    def resource_pool_manager(
        self, spec: Mapping[str, Sequence[int]], mapping: Mapping[Any, str]
    ) -> ResourcePoolManager:
        """The backend's ``ResourcePoolManager`` of pools ``spec`` for roles ``mapping``."""

    def class_with_init(self, cls: type[W], **kwargs: Any) -> ClassWithInitArgs[W]:
        """The backend's ``ClassWithInitArgs`` for ``cls(**kwargs)``."""

    def create_colocated_worker_cls(
        self, class_dict: Mapping[str, ClassWithInitArgs[Any]]
    ) -> ClassWithInitArgs[Worker]:
        """One class holding every role of ``class_dict`` (one process per rank)."""

    def worker_group(
        self, pool: ResourcePool, cls: ClassWithInitArgs[W], name: str = "workers"
    ) -> WorkerGroup[W]:
        """A worker group of ``cls`` on ``pool`` (both made by this launcher); ``name``
        (the role's) names a detached run's group."""
