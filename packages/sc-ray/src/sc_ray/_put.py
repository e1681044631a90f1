"""``parallel_put`` (verl's ``verl.utils.ray_utils.parallel_put``): many objects into Ray's
object store at once, from a thread pool."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Sequence
from typing import Any

from sc_core import ConfigTypeError, InvalidConfigError

from . import _ray_api as rapi

__all__ = ["parallel_put"]

#: The most threads :func:`parallel_put` starts when ``max_workers`` is not given.
DEFAULT_MAX_WORKERS = 16


def parallel_put(data_list: Sequence[Any], max_workers: int | None = None) -> list[rapi.ObjectRef]:
    """Put every object of ``data_list`` into Ray's object store, ``max_workers`` at a time
    (default ``min(len(data_list), 16)``) on a thread pool, and return their references in
    the order of ``data_list``.

    ``data_list`` must be a non-empty list or tuple (verl asserts it is non-empty): an empty
    one is an :class:`~sc_core.InvalidConfigError` (a ``ValueError``), another type a
    :class:`~sc_core.ConfigTypeError` (a ``TypeError``), as is a ``max_workers`` that is not
    an int; one below 1 is an :class:`~sc_core.InvalidConfigError`. An object Ray cannot
    serialize raises Ray's own error, as ``ray.put`` does.
    """
    where = "parallel_put"
    if not isinstance(data_list, (list, tuple)):
        raise ConfigTypeError(
            f"{where}: data_list must be a list of objects, got "
            f"{type(data_list).__qualname__} {data_list!r:.80}"
        )
    if not data_list:
        raise InvalidConfigError(
            f"{where}: data_list is empty ({data_list!r}); give at least one object to put"
        )
    if max_workers is None:
        max_workers = min(len(data_list), DEFAULT_MAX_WORKERS)
    elif isinstance(max_workers, bool) or not isinstance(max_workers, int):
        raise ConfigTypeError(
            f"{where}: max_workers must be an int or None, got "
            f"{type(max_workers).__qualname__} {max_workers!r}"
        )
    elif max_workers < 1:
        raise InvalidConfigError(f"{where}: max_workers must be at least 1, got {max_workers}")
    with concurrent.futures.ThreadPoolExecutor(
        max_workers=max_workers, thread_name_prefix="sc-parallel-put"
    ) as pool:
        # map keeps the input order; the first failure is raised after every put finished.
        return list(pool.map(rapi.put, data_list))
