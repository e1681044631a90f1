"""Errors: remote tracebacks, failing ranks, the exception tree, pickling."""

from __future__ import annotations

import pickle
from collections.abc import Iterator

import pytest
import sc_core
from _core_fakes import group
from sc_core import (
    CallTimeoutError,
    ClassWithInitArgs,
    LocalWorkerGroup,
    ResourcePool,
    ScCoreError,
    Worker,
    WorkerDiedError,
    WorkerError,
)


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup]:
    with group((3,)) as g:
        yield g


def test_worker_error_names_method_rank_type_and_traceback(wg: LocalWorkerGroup) -> None:
    with pytest.raises(WorkerError) as info:
        wg.fail_on([1, 2])
    err = info.value
    assert err.method == "fail_on"
    assert err.rank == 1
    assert err.other_failed_ranks == (2,)
    assert err.error_type == "ValueError"
    assert err.error_message == "rank 1 refuses"
    assert isinstance(err.cause, ValueError)
    assert err.__cause__ is err.cause
    assert "in fail_on" in err.remote_traceback
    assert "_local.py" not in err.remote_traceback.splitlines()[1]  # runner frames trimmed
    text = str(err)
    assert text.startswith("fail_on failed on rank 1: ValueError: rank 1 refuses")
    assert "(also failed on rank 2)" in text
    assert "Remote traceback (rank 1)" in text


def test_a_failure_does_not_break_the_group(wg: LocalWorkerGroup) -> None:
    with pytest.raises(WorkerError):
        wg.fail_on([0])
    assert wg.fail_on([]) == [0, 1, 2]


class BrokenInit(Worker):
    def __init__(self) -> None:
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("cannot start")


def test_constructor_failure_names_the_rank() -> None:
    with pytest.raises(WorkerError, match=r"BrokenInit.__init__ failed on rank 1: RuntimeError"):
        LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(BrokenInit))


def test_errors_survive_pickling() -> None:
    werr = WorkerError("m", 2, "ValueError", "bad", "tb text", other_failed_ranks=(3,))
    back = pickle.loads(pickle.dumps(werr))
    assert (back.method, back.rank, back.error_type, back.remote_traceback) == (
        "m",
        2,
        "ValueError",
        "tb text",
    )
    assert back.other_failed_ranks == (3,)
    assert str(back) == str(werr)
    died = pickle.loads(pickle.dumps(WorkerDiedError("m", [3, 1], "gone")))
    assert died.ranks == (1, 3)
    assert str(died) == "m: worker ranks [1, 3] died (gone)"
    timeout = pickle.loads(pickle.dumps(CallTimeoutError("m", [0], 1.5)))
    assert timeout.pending_ranks == (0,)
    assert str(timeout) == "m: no answer from rank 0 within the 1.5s timeout"


def test_worker_error_without_traceback() -> None:
    assert str(WorkerError("m", 0, "E", "x", "")) == "m failed on rank 0: E: x"
    assert str(WorkerDiedError(None, [2])) == "worker rank 2 died"


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("WorkerError", RuntimeError),
        ("WorkerDiedError", RuntimeError),
        ("CallTimeoutError", TimeoutError),
        ("RendezvousError", RuntimeError),
        ("RendezvousTimeoutError", TimeoutError),
        ("WorkerGroupError", RuntimeError),
        ("UnknownMethodError", AttributeError),
        ("InvalidConfigError", ValueError),
        ("InvalidConfigError", TypeError),
        ("ResourcePoolError", ValueError),
        ("InvalidCallOptionsError", ValueError),
        ("MethodCollisionError", ValueError),
        ("ColocationError", ValueError),
        ("WorkerEnvironmentError", ValueError),
        ("MissingEnvironmentError", KeyError),
        ("VisibleDevicesError", ValueError),
        ("MeshRegistrationError", ValueError),
        ("UnknownMeshError", KeyError),
    ],
)
def test_every_error_is_an_sc_core_error_and_its_builtin(name: str, builtin: type) -> None:
    cls = getattr(sc_core, name)
    assert issubclass(cls, ScCoreError)
    assert issubclass(cls, builtin)
    assert name in (sc_core._errors.__doc__ or "")
