"""@register: the stored settings, the typed accessor, sync/async wrapping, futures."""

from __future__ import annotations

import asyncio
import inspect
import pickle
import threading
from typing import Any

import pytest
import sc_dispatch as scd
from _dispatch_fakes import FakeFuture, FakeWorkerGroup, UnregisteredFuture, functions_of, run_call
from sc_dispatch import Dispatch, Execute, InvalidDispatchModeError, ext, register
from sc_dispatch.ext import MAGIC_ATTR, RegisterAttrs, get_register_attrs


def _dispatch_twice(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    n = worker_group.world_size
    return tuple([a * 2] * n for a in args), {k: [v * 2] * n for k, v in kwargs.items()}


def _collect_sum(worker_group: Any, output: Any) -> Any:
    return sum(output)


class Worker:
    def __init__(self, rank: int = 0) -> None:
        self.rank = rank
        self.seen: list[Any] = []

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute(self, data: list[int], scale: int = 1) -> list[int]:
        """Scale every row."""
        self.seen.append(data)
        return [x * scale for x in data]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, blocking=False)
    async def acompute(self, value: int, *, offset: int = 0) -> int:
        await asyncio.sleep(0)
        return value + offset + self.rank

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def only_rank_zero(self) -> str:
        return "zero"

    @register(materialize_futures=False)
    def raw(self, value: Any) -> Any:
        return value

    @register(materialize_futures=False)
    async def araw(self, value: Any) -> Any:
        return value

    @register(dispatch_mode={"dispatch_fn": _dispatch_twice, "collect_fn": _collect_sum})
    def custom(self, value: int) -> int:
        return value + self.rank

    @register()
    def echo(self, value: Any) -> Any:
        return value

    def plain(self) -> None:
        """Not registered."""


def test_stores_verl_shaped_dict_under_magic_attr() -> None:
    assert MAGIC_ATTR == "attrs_3141562937"
    assert getattr(Worker.compute, MAGIC_ATTR) == {
        "dispatch_mode": Dispatch.DP_COMPUTE_PROTO,
        "execute_mode": Execute.ALL,
        "blocking": True,
        "materialize_futures": True,
    }
    assert getattr(Worker.acompute, MAGIC_ATTR)["blocking"] is False
    assert getattr(Worker.raw, MAGIC_ATTR)["materialize_futures"] is False
    assert not hasattr(Worker.plain, MAGIC_ATTR)


def test_default_mode_is_all_to_all_with_execute_all() -> None:
    attrs = get_register_attrs(Worker.raw)
    assert attrs == RegisterAttrs(Dispatch.ALL_TO_ALL, Execute.ALL, True, False)


def test_typed_accessor() -> None:
    attrs = get_register_attrs(Worker.compute)
    assert isinstance(attrs, RegisterAttrs)
    assert attrs.dispatch_mode is Dispatch.DP_COMPUTE_PROTO
    assert attrs.execute_mode is Execute.ALL
    assert attrs.blocking is True
    assert attrs.materialize_futures is True
    assert get_register_attrs(Worker.plain) is None
    assert get_register_attrs(42) is None
    bound = Worker().compute
    assert get_register_attrs(bound) == attrs
    with pytest.raises(AttributeError):
        attrs.blocking = False  # type: ignore[misc]


def test_typed_accessor_reads_hand_written_verl_dicts() -> None:
    def legacy() -> None: ...

    setattr(
        legacy,
        MAGIC_ATTR,
        {"dispatch_mode": Dispatch.ONE_TO_ALL, "execute_mode": Execute.ALL, "blocking": 0},
    )
    attrs = get_register_attrs(legacy)
    assert attrs == RegisterAttrs(Dispatch.ONE_TO_ALL, Execute.ALL, False, True)

    def broken() -> None: ...

    setattr(broken, MAGIC_ATTR, {"dispatch_mode": Dispatch.ONE_TO_ALL})
    with pytest.raises(InvalidDispatchModeError, match=r"broken.*without 'execute_mode'"):
        get_register_attrs(broken)

    def not_a_dict() -> None: ...

    setattr(not_a_dict, MAGIC_ATTR, "junk")
    assert get_register_attrs(not_a_dict) is None


def test_wrapping_keeps_name_doc_and_signature() -> None:
    assert Worker.compute.__name__ == "compute"
    assert Worker.compute.__qualname__ == "Worker.compute"
    assert Worker.compute.__doc__ == "Scale every row."
    params = list(inspect.signature(Worker.compute).parameters)
    assert params == ["self", "data", "scale"]
    assert list(inspect.signature(Worker.acompute).parameters) == ["self", "value", "offset"]


def test_sync_method_works() -> None:
    assert Worker().compute([1, 2], scale=3) == [3, 6]
    assert Worker().only_rank_zero() == "zero"


def test_async_methods_stay_coroutine_functions_and_work() -> None:
    assert inspect.iscoroutinefunction(Worker.acompute)
    assert inspect.iscoroutinefunction(Worker.araw)
    assert not inspect.iscoroutinefunction(Worker.compute)
    worker = Worker(rank=2)
    assert asyncio.run(worker.acompute(1, offset=10)) == 13
    futures = worker.acompute(FakeFuture(1), offset=FakeFuture(10))  # type: ignore[arg-type]
    assert asyncio.run(futures) == 13
    assert asyncio.run(worker.araw(5)) == 5


def test_materialize_futures_resolves_args_and_kwargs() -> None:
    worker = Worker()
    data, scale = FakeFuture([1, 2, 3]), FakeFuture(10)
    assert worker.compute(data, scale=scale) == [10, 20, 30]  # type: ignore[arg-type]
    assert worker.seen == [[1, 2, 3]]
    assert (data.gets, scale.gets) == (1, 1)


def test_materialize_futures_false_passes_futures_through() -> None:
    fut = FakeFuture(1)
    assert Worker().raw(fut) is fut
    assert fut.gets == 0
    afut = FakeFuture(2)
    assert asyncio.run(Worker().araw(afut)) is afut
    assert afut.gets == 0


def test_only_registered_future_types_are_resolved() -> None:
    lookalike = UnregisteredFuture()
    assert isinstance(lookalike, ext.FutureLike)
    assert not ext.is_future(lookalike)
    assert ext.is_future(FakeFuture(0))
    assert Worker().echo(lookalike) is lookalike


def test_materialize_function() -> None:
    fut = FakeFuture("v")
    args, kwargs = ext.materialize((fut, 1), {"k": fut, "j": [fut]})
    assert args == ("v", 1)
    assert kwargs["k"] == "v"
    assert kwargs["j"] == [fut]  # only top-level arguments are resolved


def test_registering_a_future_type_twice_is_harmless() -> None:
    ext.register_future_type(FakeFuture)
    ext.register_future_type(FakeFuture)
    assert ext.is_future(FakeFuture(0))
    assert not ext.is_future(0)


def test_rank_zero_defaults_to_execute_rank_zero_and_rejects_all() -> None:
    attrs = get_register_attrs(Worker.only_rank_zero)
    assert attrs is not None
    assert attrs.execute_mode is Execute.RANK_ZERO
    with pytest.raises(InvalidDispatchModeError, match=r"Dispatch.RANK_ZERO .* got <Execute.ALL"):
        register(dispatch_mode=Dispatch.RANK_ZERO, execute_mode=Execute.ALL)
    explicit = register(dispatch_mode=Dispatch.RANK_ZERO, execute_mode=Execute.RANK_ZERO)
    assert explicit is not None


def test_other_modes_may_run_on_rank_zero() -> None:
    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def f() -> None: ...

    attrs = get_register_attrs(f)
    assert attrs is not None
    assert attrs.execute_mode is Execute.RANK_ZERO


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (
            {"dispatch_mode": "DP_COMPUTE"},
            r"dispatch_mode must be a Dispatch .* got str 'DP_COMPUTE'",
        ),
        ({"dispatch_mode": 3}, r"got int 3"),
        ({"execute_mode": "ALL"}, r"execute_mode must be an Execute member, got 'ALL'"),
        ({"execute_mode": Dispatch.ONE_TO_ALL}, r"execute_mode .* got <Dispatch.ONE_TO_ALL"),
        ({"blocking": "yes"}, r"blocking must be a bool, got 'yes'"),
        ({"materialize_futures": 1}, r"materialize_futures must be a bool, got 1"),
    ],
)
def test_bad_arguments_are_rejected(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TypeError, match=match) as info:
        register(**kwargs)
    assert isinstance(info.value, scd.DispatchModeTypeError)
    assert not isinstance(info.value, ValueError)


def test_bare_decorator_is_rejected() -> None:
    def method(self: Any) -> None: ...

    with pytest.raises(TypeError, match=r"got function"):
        register(method)  # type: ignore[call-overload]


def test_decorating_a_non_callable_is_rejected() -> None:
    with pytest.raises(TypeError, match=r"register: expected a function, got 5"):
        register()(5)  # type: ignore[call-overload]


def test_mapping_custom_mode() -> None:
    attrs = get_register_attrs(Worker.custom)
    assert attrs is not None
    assert isinstance(attrs.dispatch_mode, dict)
    spec = ext.resolve_dispatch_mode(attrs.dispatch_mode)
    assert spec.dispatch_fn is _dispatch_twice
    assert spec.collect_fn is _collect_sum
    assert spec.name == "_dispatch_twice"
    assert functions_of(spec).unpad_output is True
    wg = FakeWorkerGroup(3)
    workers = [Worker(rank) for rank in range(3)]
    out = run_call(wg, attrs.dispatch_mode, lambda r, v: workers[r].custom(v), 5)
    assert out == (10 + 0) + (10 + 1) + (10 + 2)


def test_mapping_custom_mode_name_and_unpad_flag() -> None:
    spec = ext.resolve_dispatch_mode(
        {
            "dispatch_fn": _dispatch_twice,
            "collect_fn": _collect_sum,
            "name": "twice",
            "unpad_output": False,
        }
    )
    assert (spec.name, functions_of(spec).unpad_output) == ("twice", False)


def test_registered_functions_pickle_by_reference() -> None:
    assert pickle.loads(pickle.dumps(Worker.compute)) is Worker.compute


class _LoopFedFuture(FakeFuture):
    """A future whose value another coroutine on the worker's event loop provides: ``get()``
    blocks until that coroutine has run (at most a few seconds, so a regression fails
    instead of hanging)."""

    def __init__(self) -> None:
        super().__init__(None)
        self.ready = threading.Event()

    def get(self) -> Any:
        if not self.ready.wait(timeout=5):
            raise TimeoutError("the producer never ran: get() blocked the event loop")
        return super().get()


def test_async_method_materializes_futures_off_the_event_loop() -> None:
    """An asyncio actor runs all its methods on one loop: a consumer waiting for a future
    produced by another coroutine of the same worker must leave the loop free."""
    future = _LoopFedFuture()

    class AsyncWorker:
        @register(dispatch_mode=Dispatch.ONE_TO_ALL)
        async def consume(self, value: Any) -> Any:
            return value

    async def produce() -> None:
        await asyncio.sleep(0.05)
        future.value = "produced"
        future.ready.set()

    async def main() -> Any:
        consumed, _ = await asyncio.gather(AsyncWorker().consume(future), produce())
        return consumed

    assert asyncio.run(main()) == "produced"
    assert future.gets == 1
