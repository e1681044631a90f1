"""A driver re-attaching to a run's worker group (``_run.py``): the recorded actors found by
name, dead ones marked dead, and the live ones' code and configuration checked against what
this driver would create (``_fingerprint.py``); the group's live spares (``standby=N``) are
adopted when they run this driver's code, and killed otherwise. The fingerprint is asked on
the actors' control lane (``_actor_class.CONTROL_GROUP``): a rank busy in a call, even one
whose peers never got it (a torn call), answers at once and is not taken as lost."""

from __future__ import annotations

import logging
import time
from typing import Any

from . import _ray_api as rapi
from ._actor_class import CONTROL_GROUP, FINGERPRINT_METHOD
from ._class_with_init import RayClassWithInitArgs
from ._errors import RunMismatchError
from ._fingerprint import Fingerprint, fingerprint, fingerprint_differences
from ._resource_pool import RayResourcePool
from ._standby import AdoptedSpare
from ._worker_group import RayWorkerGroup

__all__ = ["expected_fingerprint", "qualname", "reattach_group"]

logger = logging.getLogger("sc_ray.runs")

#: How long a driver waits for a worker's fingerprint (seconds).
FINGERPRINT_TIMEOUT_S = 30.0
#: How long a driver waits for the previous driver's spares it does not keep to die (seconds).
SPARE_STOP_S = 10.0


def qualname(cia: RayClassWithInitArgs[Any]) -> str:
    """The worker class of ``cia`` as ``module.QualName``."""
    cls = cia.worker_cls
    return f"{cls.__module__}.{cls.__qualname__}"


def expected_fingerprint(cia: RayClassWithInitArgs[Any]) -> Fingerprint:
    """The fingerprint a new worker of ``cia`` would record (``_fingerprint.py``)."""
    return fingerprint(cia.worker_cls, cia.args, cia.kwargs)


def _stop_spares(where: str, names: list[str]) -> None:
    """Kill spare actors of the previous driver this one does not keep, and wait until they
    are dead."""
    spares = [a for a in (_live_actor(n) for n in names) if a is not None]
    for spare in spares:
        rapi.kill(spare)
    deadline = rapi.monotonic() + SPARE_STOP_S
    for spare in spares:
        while rapi.actor_state(spare) != "DEAD" and rapi.monotonic() < deadline:
            time.sleep(0.05)
    if spares:
        logger.info("%s: stopped the previous driver's spares %s", where, names)


def _spares_to_adopt(
    recorded: dict[str, Any],
) -> tuple[list[AdoptedSpare], list[rapi.ObjectRef]]:
    """The recorded spares that are alive and on a recorded node, and a fingerprint call
    on each (checked by :func:`_keep_spares`)."""
    nodes: dict[str, int] = recorded.get("spare_nodes") or {}
    found: list[AdoptedSpare] = []
    for name in recorded.get("spares", []):
        actor = _live_actor(name)
        if actor is not None and name in nodes:
            found.append(AdoptedSpare(actor, name, int(nodes[name])))
    refs = [rapi.call_actor(s.actor, FINGERPRINT_METHOD, (), {}) for s in found]
    return found, refs


def _keep_spares(
    where: str,
    recorded: dict[str, Any],
    found: list[AdoptedSpare],
    refs: list[rapi.ObjectRef],
    expected: Fingerprint,
) -> list[AdoptedSpare]:
    """The spares of ``found`` that run this driver's code (a spare has built no worker
    yet: only its code is compared); the others, and the recorded spares not found, are
    stopped."""
    kept: list[AdoptedSpare] = []
    ours: Fingerprint = {"code": expected.get("code", {}), "config": {}}
    for spare, ref in zip(found, refs, strict=True):
        try:
            theirs: Fingerprint = rapi.get([ref], timeout_s=FINGERPRINT_TIMEOUT_S)[0]
        except Exception as exc:  # died, or still starting after the timeout: not kept
            logger.warning("%s spare %s: no fingerprint (%s); not kept", where, spare.name, exc)
            continue
        diffs = fingerprint_differences({"code": theirs.get("code", {}), "config": {}}, ours)
        if diffs:
            logger.warning("%s spare %s: not kept: %s", where, spare.name, "; ".join(diffs))
            continue
        kept.append(spare)
    names = {spare.name for spare in kept}
    _stop_spares(where, [n for n in recorded.get("spares", []) if n not in names])
    return kept


def _live_actor(name: str) -> rapi.ActorHandle | None:
    try:
        actor = rapi.get_actor(name)
    except ValueError:
        return None
    return None if rapi.actor_state(actor) == "DEAD" else actor


def reattach_group(
    where: str,
    recorded: dict[str, Any],
    pool_name: str,
    pool: RayResourcePool,
    cia: RayClassWithInitArgs[Any],
    kwargs: dict[str, Any],
) -> RayWorkerGroup[Any]:
    """The recorded group over its live actors: ranks whose actor is dead are marked dead
    (the driver replaces them); every live worker's code and configuration must match what
    this driver would create (:class:`RunMismatchError`); the previous driver's live spares
    that run this driver's code are adopted (``standby=N`` in ``kwargs`` keeps up to N of
    them and starts the missing ones; without it they are stopped)."""
    if recorded["pool"] != pool_name:
        raise RunMismatchError(
            f"{where}: the run placed it in pool {recorded['pool']!r}, this driver "
            f"asks pool {pool_name!r}"
        )
    if recorded["cls"] != qualname(cia):
        raise RunMismatchError(
            f"{where}: the run's workers run {recorded['cls']}, this driver asks {qualname(cia)}"
        )
    names: list[str] = list(recorded["workers"])
    workers = [_live_actor(n) for n in names]
    expected = expected_fingerprint(cia)
    refs = {  # on the control lane: a rank busy in a (torn) call answers at once
        rank: rapi.call_actor(w, FINGERPRINT_METHOD, (), {}, CONTROL_GROUP)
        for rank, w in enumerate(workers)
        if w is not None
    }
    spares, spare_refs = _spares_to_adopt(recorded)
    for rank, ref in refs.items():
        try:
            theirs: Fingerprint = rapi.get([ref], timeout_s=FINGERPRINT_TIMEOUT_S)[0]
        except Exception as exc:  # it died meanwhile: a dead rank, replaced later
            logger.warning("%s rank %d: no fingerprint (%s); taken as dead", where, rank, exc)
            workers[rank] = None
            continue
        diffs = fingerprint_differences(theirs, expected)
        if diffs:
            raise RunMismatchError(f"{where} rank {rank}: " + "; ".join(diffs))
    kept = _keep_spares(where, recorded, spares, spare_refs, expected)
    dead = [r for r, w in enumerate(workers) if w is None]
    if dead:
        logger.warning("%s: ranks %s are dead; replace them (replace_ranks)", where, dead)
    return RayWorkerGroup._sc_reattach(
        pool,
        cia,
        recorded["name_prefix"],
        workers,
        names,
        (recorded.get("master_addr"), recorded.get("master_port")),
        int(recorded.get("generation", 0)),
        adopted_spares=kept,
        standby_started=int(recorded.get("standby_started", 0)),
        standby_devices=recorded.get("standby_devices"),
        **kwargs,
    )
