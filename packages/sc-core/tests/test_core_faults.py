"""Injected faults (``WorkerGroup.inject_fault``) on the in-process backend: a raised fault
reaches the driver as a WorkerError, a kill as a death after the method ran, each fires once
on the rank it was armed on, through a spawned view's plain name too, and every bad argument
is refused."""

from __future__ import annotations

from typing import Any

import pytest
from sc_core import (
    ClassWithInitArgs,
    ConfigTypeError,
    InjectedFaultError,
    InvalidConfigError,
    LocalWorkerGroup,
    ResourcePool,
    UnknownMethodError,
    Worker,
    WorkerDiedError,
    WorkerError,
    create_colocated_worker_cls,
)
from sc_core.backend import ArmedFault
from sc_dispatch import Dispatch, register


class Counter(Worker):
    def __init__(self) -> None:
        super().__init__()
        self.ran = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def step(self) -> int:
        self.ran += 1
        return self.ran

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ran_count(self) -> int:
        return self.ran


def _group(n: int = 3) -> LocalWorkerGroup[Any]:
    return LocalWorkerGroup(ResourcePool([n]), ClassWithInitArgs(Counter))


def test_a_raised_fault_fires_once_on_its_rank() -> None:
    with _group() as wg:
        wg.inject_fault(1, "step", action="raise")
        with pytest.raises(WorkerError, match="rank 1") as info:
            wg.step()
        assert isinstance(info.value, InjectedFaultError)
        assert info.value.rank == 1
        assert info.value.method == "step"
        assert wg.ran_count() == [1, 0, 1]  # rank 1's method did not run
        assert wg.step() == [2, 1, 2]  # disarmed: the next call runs everywhere


def test_a_kill_lets_the_method_run_then_reports_the_rank_dead() -> None:
    with _group() as wg:
        wg.inject_fault(2, "step")
        assert wg.ran_count() == [0, 0, 0]  # another method does not fire it
        with pytest.raises(WorkerDiedError, match="rank 2"):
            wg.step()
        assert wg.dead_ranks == [2]
        assert wg.replace_ranks() == [2]
        assert wg.step() == [2, 2, 1]  # the new rank 2 has no fault armed


def test_a_fault_armed_through_a_spawned_view_fires_on_the_role() -> None:
    cls = create_colocated_worker_cls({"a": ClassWithInitArgs(Counter)})
    with LocalWorkerGroup(ResourcePool([2]), cls) as wg:
        view = wg.spawn(["a"])["a"]
        view.inject_fault(0, "step", action="raise")
        with pytest.raises(InjectedFaultError, match="rank 0"):
            view.step()
        assert view.step() == [1, 2]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"rank": 3, "method": "step"}, InvalidConfigError, "rank 3 is outside"),
        ({"rank": True, "method": "step"}, ConfigTypeError, "rank must be an int"),
        ({"rank": 0, "method": "nope"}, UnknownMethodError, "'nope' is no method"),
        ({"rank": 0, "method": 5}, ConfigTypeError, "method must be a str"),
        ({"rank": 0, "method": "step", "action": "explode"}, InvalidConfigError, "action"),
        ({"rank": 0, "method": "step", "delay_s": -1.0}, InvalidConfigError, "delay_s"),
        ({"rank": 0, "method": "step", "delay_s": "1"}, ConfigTypeError, "delay_s"),
        (
            {"rank": 0, "method": "step", "action": "raise", "delay_s": 1.0},
            InvalidConfigError,
            "delay_s must be 0",
        ),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], error: type, match: str) -> None:
    with _group() as wg:
        with pytest.raises(error, match=match):
            wg.inject_fault(**kwargs)
        assert wg.step() == [1, 1, 1]  # nothing was armed


def test_armed_fault_validates_itself() -> None:
    with pytest.raises(InvalidConfigError, match="finite"):
        ArmedFault("m", "kill", float("inf"))
    assert ArmedFault("m", "kill", 0.5).delay_s == 0.5
