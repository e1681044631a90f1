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
from sc_dispatch import Dispatch, register


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


ERROR_MEANINGS = {
    "WorkerError": RuntimeError,
    "WorkerDiedError": RuntimeError,
    "InjectedFaultError": RuntimeError,
    "CallTimeoutError": TimeoutError,
    "RendezvousError": RuntimeError,
    "RendezvousTimeoutError": TimeoutError,
    "WorkerGroupError": RuntimeError,
    "WorkerGroupClosedError": RuntimeError,
    "BackendNotImplementedError": NotImplementedError,
    "UnknownMethodError": AttributeError,
    "StaleDriverError": RuntimeError,
    "UnsupportedCallError": TypeError,
    "InvalidConfigError": ValueError,
    "ConfigTypeError": TypeError,
    "ResourcePoolError": ValueError,
    "InvalidCallOptionsError": ValueError,
    "MethodCollisionError": TypeError,
    "ColocationError": ValueError,
    "UnknownRoleError": KeyError,
    "WorkerEnvironmentError": ValueError,
    "MissingEnvironmentError": KeyError,
    "VisibleDevicesError": ValueError,
    "MeshRegistrationError": ValueError,
    "UnknownMeshError": KeyError,
}
MEANINGS = (
    ValueError,
    TypeError,
    KeyError,
    LookupError,
    IndexError,
    NotImplementedError,
    RuntimeError,
    TimeoutError,
    OSError,
    AttributeError,
)


def _meanings(exc: type[BaseException]) -> list[type[BaseException]]:
    found = [m for m in MEANINGS if issubclass(exc, m)]
    return [m for m in found if not any(o is not m and issubclass(o, m) for o in found)]


#: where the errors are exported: the user's and the backend writer's tier
ERROR_MODULES = (sc_core, sc_core.backend)


@pytest.mark.parametrize(("name", "builtin"), sorted(ERROR_MEANINGS.items()))
def test_every_error_subclasses_exactly_the_builtin_it_means(name: str, builtin: type) -> None:
    (cls,) = {getattr(m, name) for m in ERROR_MODULES if name in m.__all__}
    assert issubclass(cls, ScCoreError)
    assert _meanings(cls) == [builtin]
    assert name in (sc_core._errors.__doc__ or "")


def test_the_table_covers_every_public_error() -> None:
    public = {
        name
        for module in ERROR_MODULES
        for name in module.__all__
        if isinstance(getattr(module, name), type)
        and issubclass(getattr(module, name), BaseException)
        and name != "ScCoreError"
    }
    assert public == set(ERROR_MEANINGS)
    assert ScCoreError.__bases__ == (Exception,)


class Raiser(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def boom(self, kind: str) -> None:
        errors: dict[str, BaseException] = {
            "value": ValueError(f"bad value on rank {self.rank}"),
            "key": KeyError("missing"),
            "custom": CustomFailure(3),
            "os": FileNotFoundError("no such file"),
            "runtime": RuntimeError("plain"),
        }
        raise errors[kind]


class CustomFailure(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(f"custom failure {code}")
        self.code = code


@pytest.mark.parametrize(
    ("kind", "builtin"),
    [
        ("value", ValueError),
        ("key", KeyError),
        ("custom", CustomFailure),
        ("runtime", RuntimeError),
    ],
)
def test_a_remote_exception_is_caught_by_its_own_class(kind: str, builtin: type) -> None:
    with group((2,), Raiser) as wg, pytest.raises(builtin) as info:
        wg.boom(kind)
    err = info.value
    assert isinstance(err, WorkerError)
    assert (err.method, err.rank, err.other_failed_ranks) == ("boom", 0, (1,))
    assert isinstance(err.cause, builtin)
    assert "Remote traceback (rank 0)" in str(err)
    if kind == "custom":
        assert err.cause.code == 3  # type: ignore[union-attr]
    # The mirrored class pickles and comes back as the same kind of error.
    again = pickle.loads(pickle.dumps(err))
    assert isinstance(again, WorkerError)
    assert isinstance(again, builtin)
    assert str(again) == str(err)


def test_exception_classes_that_cannot_be_combined_give_a_plain_worker_error() -> None:
    with group((1,), Raiser) as wg, pytest.raises(WorkerError) as info:
        wg.boom("os")
    assert type(info.value) is WorkerError
    assert isinstance(info.value.cause, FileNotFoundError)
    assert info.value.error_type == "FileNotFoundError"


def test_remote_tracebacks_lose_their_terminal_colour_codes() -> None:
    coloured = "\x1b[36mray::Worker.fail()\x1b[39m\nTraceback ...\n\x1b[1;31mValueError\x1b[0m: bad"
    err = WorkerError("fail", 0, "ValueError", "\x1b[31mbad\x1b[0m", coloured)
    assert "\x1b" not in str(err)
    assert "\x1b" not in err.remote_traceback
    assert err.error_message == "bad"
    assert "ray::Worker.fail()" in err.remote_traceback


class _PeerGone(RuntimeError):
    """A rank's error that says another rank caused it (a collective whose peer failed)."""

    sc_caused_by_peer = True


class Pipeline(Worker):
    """Rank 2 fails on its own; ranks 0 and 1 fail because it did."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self) -> int:
        if self.rank == 2:
            raise ValueError("rank 2: index out of range")
        raise _PeerGone(f"rank {self.rank}: connection closed by peer")


def test_the_reported_error_is_the_one_not_caused_by_a_peer() -> None:
    """Several ranks failed: the error reported is the lowest rank's whose error is its own,
    the others listed; with every error caused by a peer, the lowest rank's."""
    wg = LocalWorkerGroup(ResourcePool([3]), ClassWithInitArgs(Pipeline))
    try:
        with pytest.raises(WorkerError) as info:
            wg.step()
        assert info.value.rank == 2
        assert info.value.other_failed_ranks == (0, 1)
        assert isinstance(info.value.cause, ValueError)
    finally:
        wg.close()
    errors: dict[int, BaseException | None] = {0: _PeerGone("a"), 1: _PeerGone("b")}
    assert sc_core.backend.reported_rank(errors) == 0
    errors[3] = ValueError("own")
    assert sc_core.backend.reported_rank(errors) == 3
    wrapped = WorkerError.from_exception("step", 1, _PeerGone("x"))
    assert sc_core.backend.caused_by_peer(wrapped)
    assert not sc_core.backend.caused_by_peer(WorkerError.from_exception("s", 0, KeyError("k")))
    assert not sc_core.backend.caused_by_peer(None)
    assert sc_core.backend.CAUSED_BY_PEER_ATTR == "sc_caused_by_peer"
