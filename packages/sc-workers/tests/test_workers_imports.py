"""The public surface: ``__all__`` resolves, and importing stays free of optional extras."""

from __future__ import annotations

import subprocess
import sys

import sc_workers
import sc_workers.algos
import sc_workers.engine
import sc_workers.models
import sc_workers.rollout
import sc_workers.workers


def test_every_public_name_resolves() -> None:
    for module in (
        sc_workers,
        sc_workers.algos,
        sc_workers.engine,
        sc_workers.models,
        sc_workers.rollout,
        sc_workers.workers,
    ):
        for name in module.__all__:
            assert getattr(module, name) is not None, f"{module.__name__}.{name}"


MEANINGS = (
    ValueError,
    TypeError,
    KeyError,
    LookupError,
    NotImplementedError,
    RuntimeError,
    ImportError,
    OSError,
)


def _meanings(exc: type[BaseException]) -> list[type[BaseException]]:
    found = [m for m in MEANINGS if issubclass(exc, m)]
    return [m for m in found if not any(o is not m and issubclass(o, m) for o in found)]


def test_exception_tree() -> None:
    expected = {
        "ConfigError": ValueError,
        "UnsupportedParallelismError": NotImplementedError,
        "BatchError": ValueError,
        "MissingBatchKeyError": KeyError,
        "DistributedError": RuntimeError,
        "NotInitializedError": RuntimeError,
        "CheckpointError": RuntimeError,
        "OptionalDependencyError": ImportError,
    }
    for name, meaning in expected.items():
        assert _meanings(getattr(sc_workers, name)) == [meaning], name
    for name in sc_workers.__all__:
        obj = getattr(sc_workers, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, sc_workers.ScWorkersError), name
    assert str(sc_workers.MissingBatchKeyError("no 'x'")) == "no 'x'"


def test_import_does_not_load_transformers_or_torch_pipelining() -> None:
    """Every worker process imports sc_workers: transformers loads with a Hugging Face model
    only, torch's pipelining (dynamo, sympy: seconds) with a pipeline schedule only."""
    heavy = ("transformers", "torch.distributed.pipelining", "torch._dynamo")
    code = f"import sys, sc_workers; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=100
    )
    assert out.stdout.strip() == "[]"
