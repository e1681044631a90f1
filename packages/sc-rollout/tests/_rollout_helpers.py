"""Helpers of the sc-rollout tests: servers on threads, requests, waiting for a condition."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import TypeVar

from hypothesis import settings
from sc_rollout import (
    GenerateRequest,
    RolloutServer,
    SamplingParams,
    ToyEngine,
    ToyEngineConfig,
)

PROPERTY = settings(deadline=None, max_examples=40)

T = TypeVar("T")
R = TypeVar("R")


@contextmanager
def toy_servers(*configs: ToyEngineConfig) -> Iterator[list[RolloutServer]]:
    """One toy-engine server per config, each on a thread of this process."""
    servers = [RolloutServer(ToyEngine(config)).start() for config in configs]
    try:
        yield servers
    finally:
        for server in servers:
            server.stop()


def request(
    prompt: Sequence[int] = (1, 2, 3),
    *,
    max_tokens: int = 4,
    seed: int | None = 0,
    session: str | None = None,
    request_id: str | None = None,
) -> GenerateRequest:
    extra = {} if request_id is None else {"request_id": request_id}
    return GenerateRequest(
        prompt_ids=tuple(prompt),
        sampling=SamplingParams(max_tokens=max_tokens, seed=seed),
        session_id=session,
        **extra,
    )


def in_threads(fn: Callable[[T], R], items: Sequence[T], workers: int) -> list[R]:
    """``fn`` over ``items`` on ``workers`` threads, results in order."""
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def wait_until(predicate: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll ``predicate`` until it holds; fail the test after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
