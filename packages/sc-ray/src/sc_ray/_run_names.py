"""How a run's things are named: its Ray namespace, its registry actor, its placement groups.

A run ``<id>`` lives in the Ray namespace ``sc-run-<id>``: its registry actor is
``sc-run-registry`` there, its worker actors are named there, and its placement groups are
named ``sc-run-<id>:<pool>:<i>`` (placement group names are scoped by namespace too, but
the prefix lets an operator find them from any namespace).
"""

from __future__ import annotations

import re

from ._errors import RunIdError

__all__ = [
    "NAMESPACE_PREFIX",
    "REGISTRY_NAME",
    "RUN_ID_PATTERN",
    "check_run_id",
    "pg_prefix",
    "run_namespace",
]

#: What a run id looks like.
RUN_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
NAMESPACE_PREFIX = "sc-run-"
#: The name of a run's registry actor, in the run's namespace.
REGISTRY_NAME = "sc-run-registry"


def check_run_id(run_id: object) -> str:
    """``run_id`` if it is a valid run id, else :class:`RunIdError`."""
    if not isinstance(run_id, str) or RUN_ID_PATTERN.fullmatch(run_id) is None:
        raise RunIdError(
            f"run id {run_id!r} is not valid: it must match {RUN_ID_PATTERN.pattern} (a letter "
            "or digit, then up to 63 letters, digits, '_', '.' or '-')"
        )
    return run_id


def run_namespace(run_id: str) -> str:
    """The Ray namespace of run ``run_id``: ``"sc-run-<run_id>"``. A driver connects with
    ``ray.init(address=..., namespace=run_namespace(run_id))``."""
    return f"{NAMESPACE_PREFIX}{check_run_id(run_id)}"


def pg_prefix(namespace: str) -> str:
    """The prefix of the names of a run's placement groups."""
    return f"{namespace}:"
