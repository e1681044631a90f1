"""LocalWorkerGroup specifics: construction, async, turns, concurrency, inline, breakpoints."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
from typing import Any, ClassVar

import pytest
from _core_fakes import EchoWorker, group, make_group
from sc_core import (
    ClassWithInitArgs,
    ConfigTypeError,
    InvalidConfigError,
    LocalWorkerGroup,
    ResourcePool,
    ResourcePoolError,
    Worker,
    WorkerGroupError,
    worker_environ,
)
from sc_core.backend import Call, CallHandle, register_class_unwrapper
from sc_dispatch import Dispatch, Execute, register


class EnvWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def identity(self) -> tuple[str, str, str, str, str | None, str | None]:
        env = worker_environ()
        return (
            env["RANK"],
            env["WORLD_SIZE"],
            env["LOCAL_RANK"],
            env["LOCAL_WORLD_SIZE"],
            *self.get_master_addr_port(),
        )

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def thread_name(self) -> str:
        return threading.current_thread().name


def test_each_rank_gets_its_own_environment_and_the_process_one_is_untouched() -> None:
    before = dict(os.environ)
    with group((2, 1), EnvWorker) as wg:
        out = wg.identity()
        addr, port = out[0][4], out[0][5]
        assert addr
        assert port
        assert out == [
            ("0", "3", "0", "2", addr, port),
            ("1", "3", "1", "2", addr, port),
            ("2", "3", "0", "1", addr, port),
        ]
        assert wg._master_addr == addr
    assert dict(os.environ) == before


def test_each_rank_runs_on_its_own_thread() -> None:
    with group((2,), EnvWorker, name_prefix="thr") as wg:
        assert wg.thread_name() == ["sc-local-thr-rank0", "sc-local-thr-rank1"]


def test_async_methods_run_to_completion() -> None:
    with group((3,)) as wg:
        assert wg.async_rank(0.001) == [0, 1, 2]
        assert wg.async_rank() == [0, 1, 2]


class AsyncStateWorker(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.lock: asyncio.Lock | None = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    async def use_lock(self) -> int:
        # An asyncio object made in one call still works in the next: one loop per rank.
        if self.lock is None:
            self.lock = asyncio.Lock()
        async with self.lock:
            await asyncio.sleep(0)
        return self.rank


def test_each_rank_keeps_one_event_loop() -> None:
    with group((2,), AsyncStateWorker) as wg:
        assert wg.use_lock() == [0, 1]
        assert wg.use_lock() == [0, 1]


class OrderWorker(Worker):
    log: ClassVar[list[int]] = []
    barrier: ClassVar[threading.Barrier | None] = None

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def record(self) -> int:
        OrderWorker.log.append(self.rank)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def meet(self) -> int:
        if OrderWorker.barrier is None:  # pragma: no cover - set by the test
            raise RuntimeError("no barrier")
        OrderWorker.barrier.wait(timeout=30)
        return self.rank


def test_ranks_take_turns_by_default() -> None:
    OrderWorker.log = []
    with group((4,), OrderWorker) as wg:
        wg.record()
        wg.record()
    assert OrderWorker.log == [0, 1, 2, 3, 0, 1, 2, 3]


def test_concurrent_ranks_can_meet_at_a_barrier() -> None:
    OrderWorker.barrier = threading.Barrier(3)
    with group((3,), OrderWorker, concurrent=True) as wg:
        assert wg.meet.options(timeout=60)() == [0, 1, 2]


def test_inline_mode_runs_calls_on_the_calling_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    with group((2,), EnvWorker, inline=True) as wg:
        me = threading.current_thread().name
        assert wg.thread_name() == [me, me]
    monkeypatch.setenv("SC_CORE_LOCAL_INLINE", "1")
    with group((1,), EnvWorker) as wg:
        assert wg._local._inline is True
        assert wg.thread_name() == [threading.current_thread().name]


class BreakWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stop_here(self) -> int:
        breakpoint()
        return self.rank


def test_breakpoint_in_a_worker_method_stops_in_this_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stops: list[tuple[int, str]] = []

    def hook(*args: Any, **kwargs: Any) -> None:
        frame = sys._getframe(1)
        stops.append((os.getpid(), frame.f_code.co_name))

    monkeypatch.setattr(sys, "breakpointhook", hook)
    with group((2,), BreakWorker) as wg:
        assert wg.stop_here() == [0, 1]
    assert stops == [(os.getpid(), "stop_here")] * 2


def test_constructor_errors() -> None:
    pool = ResourcePool([1])
    wg = LocalWorkerGroup(resource_pool=pool, cls_with_init=ClassWithInitArgs(EchoWorker))
    assert wg.one_to_all(1) == [(0, 1, None)]
    wg.close()
    cia = ClassWithInitArgs(EchoWorker)
    with pytest.raises(TypeError, match="ray_cls_with_init"):
        LocalWorkerGroup(pool, ray_cls_with_init=cia)  # type: ignore[call-arg]
    with pytest.raises(ConfigTypeError, match="must be a ClassWithInitArgs"):
        LocalWorkerGroup(pool, EchoWorker)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="needs a ResourcePool"):
        LocalWorkerGroup(None, cia)
    with pytest.raises(ConfigTypeError, match="resource_pool must be a ResourcePool"):
        LocalWorkerGroup([2], cia)  # type: ignore[arg-type]
    with pytest.raises(ResourcePoolError, match="no processes"):
        LocalWorkerGroup(ResourcePool(), cia)
    with pytest.raises(ConfigTypeError, match="concurrent must be a bool"):
        LocalWorkerGroup(pool, cia, concurrent=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="name_prefix must be a non-empty str"):
        LocalWorkerGroup(pool, cia, name_prefix="")
    with pytest.raises(InvalidConfigError, match="default_timeout"):
        LocalWorkerGroup(pool, cia, default_timeout=-1)


def factory(tag: str) -> EchoWorker:
    return EchoWorker(tag)


def test_a_factory_function_works_as_the_class() -> None:
    wg = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(factory, "f"))
    try:
        assert [w.tag for w in wg.workers] == ["f", "f"]
        assert wg.one_to_all(0) == [(0, 0, None), (1, 0, None)]
    finally:
        wg.close()


class _RemoteLike:
    """What ``ray.remote(EchoWorker)`` looks like: the class behind an attribute, and
    calling it directly is an error."""

    __ray_actor_class__ = EchoWorker

    def __init__(self, *args: Any) -> None:  # pragma: no cover - must not be called
        raise TypeError("Actors cannot be instantiated directly")


def _unwrap_remote_like(obj: Any) -> Any:
    return getattr(obj, "__ray_actor_class__", None)


# what sc-ray registers for ray.remote classes; sc-core itself knows no backend's names
register_class_unwrapper(_unwrap_remote_like)


class _ActorMakingCia(ClassWithInitArgs[Any]):
    """A backend's ClassWithInitArgs whose call would create a remote actor."""

    def __call__(self) -> Any:  # pragma: no cover - must not be called
        raise RuntimeError("would create an actor")


def test_backend_wrapped_classes_run_in_process() -> None:
    with LocalWorkerGroup(ResourcePool([2]), _ActorMakingCia(_RemoteLike, "t")) as wg:
        assert [w.tag for w in wg.workers] == ["t", "t"]
        assert wg.one_to_all(1) == [(0, 1, None), (1, 1, None)]


def test_a_closed_group_refuses_calls() -> None:
    with make_group((2,), name_prefix="ctx") as wg:
        assert wg.one_to_all(0) == [(0, 0, None), (1, 0, None)]
        assert repr(wg).startswith("<LocalWorkerGroup 'ctx' world_size=2 methods=")
    with pytest.raises(WorkerGroupError, match="closed"):
        wg.one_to_all(0)


def test_handles_reject_foreign_objects_and_bad_ranks() -> None:
    with group((2,)) as wg:
        call = Call(
            group="g",
            method_name="one_to_all",
            ranks=(0,),
            execute_mode=Execute.ALL,
            blocking=True,
            timeout=None,
        )
        with pytest.raises(WorkerGroupError, match="expected LocalHandle"):
            wg._local.wait(CallHandle(call, ["not a handle"]))
        with pytest.raises(WorkerGroupError, match="rank 5 out of range"):
            wg._local.submit(5, "one_to_all", (), {})
        handle = wg.execute_rank_zero_async("one_to_all", 1)
        assert handle.result(timeout=30) == (0, 1, None)
        assert handle.done()
        assert "done" in repr(handle)


_EXIT_SCRIPT = """
import atexit, threading, time

def report():  # registered before sc_core's handler, so it runs after it
    alive = [t.name for t in threading.enumerate() if t is not threading.main_thread()]
    print("alive at exit:", alive, flush=True)

atexit.register(report)

from sc_core import ClassWithInitArgs, LocalWorkerGroup, ResourcePool, Worker
from sc_dispatch import Dispatch, register


class Napper(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def nap(self, seconds: float) -> int:
        time.sleep(seconds)
        return self.rank


group = LocalWorkerGroup(ResourcePool([2]), ClassWithInitArgs(Napper))
print(group.nap(0.0), flush=True)
group.nap.options(blocking=False)(0.5)  # still running as the script ends; never closed
"""


def test_interpreter_exit_waits_for_the_rank_threads_to_end() -> None:
    """A script that never closes its group exits after its rank threads ended: a thread
    still running as the interpreter finalizes is torn out of C++ code (torch's) and the
    process aborts."""
    done = subprocess.run(
        [sys.executable, "-c", _EXIT_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == ["[0, 1]", "alive at exit: []"], done.stdout
