"""Binding: every dispatch mode through a LocalWorkerGroup, proxies, collisions, options."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from _core_fakes import Batch, EchoWorker, group, make_group, unique_name
from sc_core import (
    ClassWithInitArgs,
    ConfigTypeError,
    InvalidCallOptionsError,
    LocalWorkerGroup,
    MethodCollisionError,
    MethodProxy,
    ResourcePool,
    UnknownMethodError,
    Worker,
    WorkerGroup,
)
from sc_dispatch import (
    Dispatch,
    DispatchArgumentError,
    Execute,
    NotShardableError,
    Rows,
    UnknownDispatchModeError,
    register,
    register_dispatch_mode,
)


@pytest.fixture
def wg() -> Iterator[LocalWorkerGroup]:
    with group((2, 2)) as g:
        yield g


def test_registered_methods_are_bound_and_plain_ones_are_not(wg: LocalWorkerGroup) -> None:
    names = wg.bound_method_names
    for name in ("one_to_all", "shard_rows", "metric", "_query_dispatch_info", "later"):
        assert name in names
    assert "not_registered" not in names
    with pytest.raises(UnknownMethodError, match=r"not_registered.*bound methods"):
        wg.not_registered()
    with pytest.raises(AttributeError):
        wg.no_such_thing  # noqa: B018


def test_proxy_is_named_after_its_method(wg: LocalWorkerGroup) -> None:
    proxy = wg.shard_rows
    assert isinstance(proxy, MethodProxy)
    assert proxy.__name__ == "shard_rows"
    assert proxy.__qualname__ == "LocalWorkerGroup.shard_rows"
    assert proxy.__doc__ == "Tags each row with the rank that saw it."
    assert "dispatch=DP_COMPUTE_PROTO" in repr(proxy)
    assert "execute=ALL" in repr(proxy)


def test_one_to_all_sends_the_same_arguments_to_every_rank(wg: LocalWorkerGroup) -> None:
    assert wg.one_to_all("v", key=3) == [(r, "v", 3) for r in range(4)]


def test_all_to_all_splits_world_size_lists_and_broadcasts_the_rest(
    wg: LocalWorkerGroup,
) -> None:
    assert wg.all_to_all(["a", "b", "c", "d"]) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    assert wg.all_to_all(["a", "b"]) == [(r, ["a", "b"]) for r in range(4)]
    assert wg.all_to_all("x") == [(r, "x") for r in range(4)]


def test_rank_zero_runs_on_rank_zero_only(wg: LocalWorkerGroup) -> None:
    assert wg.rank_zero("z") == (0, "z")
    assert [w.seen for w in wg.workers] == [["z"], [], [], []]
    assert wg.first_only() == 0


def test_dp_compute_takes_one_entry_per_rank_from_lists_and_tuples(wg: LocalWorkerGroup) -> None:
    out = wg.dp_compute(("a", "b", "c", "d"), other=[1, 2, 3, 4])
    assert out == [(0, "a", 1), (1, "b", 2), (2, "c", 3), (3, "d", 4)]
    with pytest.raises(DispatchArgumentError, match=r"LocalWorkerGroup\.dp_compute: .*3 entries"):
        wg.dp_compute(("a", "b", "c"))
    with pytest.raises(NotShardableError, match="dp_compute"):
        wg.dp_compute("abcd")


def test_dp_compute_proto_splits_and_joins_in_rank_order(wg: LocalWorkerGroup) -> None:
    out = wg.shard_rows(Batch(range(8)))
    assert out == Batch([(r, row) for r in range(4) for row in (2 * r, 2 * r + 1)])
    assert wg.shard_lists(Rows(range(8))) == [10 * i for i in range(8)]
    with pytest.raises(NotShardableError, match=r"shard_lists: DP_COMPUTE_PROTO: .* is a list"):
        wg.shard_lists(list(range(8)))  # per-rank lists belong to DP_COMPUTE


def test_dp_compute_proto_pads_and_drops_the_padding(wg: LocalWorkerGroup) -> None:
    out = wg.shard_rows(Batch(range(6)))
    # 6 rows padded to 8: ranks get [0,1] [2,3] [4,5] [0,1]; padding dropped from the output.
    assert out == Batch([(0, 0), (0, 1), (1, 2), (1, 3), (2, 4), (2, 5)])


def test_uneven_batch_without_auto_padding_is_an_error(wg: LocalWorkerGroup) -> None:
    for rows in (6, 3):
        with pytest.raises(
            DispatchArgumentError,
            match=rf"shard_rows: DP_COMPUTE_PROTO: a batch of {rows} rows does not divide "
            r"evenly into 4 shards",
        ) as info:
            wg.shard_rows(Batch(range(rows), auto_pad=False))
        assert isinstance(info.value, ValueError)


def test_dp_compute_metric_keeps_every_workers_result_even_padded(wg: LocalWorkerGroup) -> None:
    out = wg.metric(Batch(range(5)))
    # 5 rows padded to 8: every rank's metric is kept, padding rows included.
    assert out == [
        {"rank": 0, "rows": [0, 1]},
        {"rank": 1, "rows": [2, 3]},
        {"rank": 2, "rows": [4, 0]},
        {"rank": 3, "rows": [1, 2]},
    ]


def test_dp_compute_proto_with_func_runs_the_function_on_each_shard(wg: LocalWorkerGroup) -> None:
    def fn(worker: Worker, batch: Batch) -> Batch:
        return Batch([worker.rank * 100 + row for row in batch.rows])

    assert wg.execute_with_func_generator(fn, Batch(range(4))) == Batch([0, 101, 202, 303])
    assert wg.execute_with_func_generator(fn, Batch(range(3))) == Batch([0, 101, 202])


def test_execute_func_rank_zero_runs_a_function_on_rank_zero(wg: LocalWorkerGroup) -> None:
    assert wg.execute_func_rank_zero(lambda a, b: a + b, 2, b=3) == 5


def test_direct_rollout_method_cannot_be_called_from_the_driver(wg: LocalWorkerGroup) -> None:
    with pytest.raises(NotImplementedError, match=r"rollout_only.*rollout engine"):
        wg.rollout_only()


def _sum_dispatch(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def _sum_collect(worker_group: Any, outputs: Sequence[int]) -> int:
    return sum(outputs)


CUSTOM = register_dispatch_mode(unique_name(), _sum_dispatch, _sum_collect)


class CustomWorker(Worker):
    @register(dispatch_mode={"dispatch_fn": _sum_dispatch, "collect_fn": _sum_collect})
    def mapped(self, value: int) -> int:
        return value + self.rank

    @register(dispatch_mode=CUSTOM)
    def registered(self, value: int) -> int:
        return value * (self.rank + 1)


def test_custom_dispatch_modes_as_mapping_and_registered_member() -> None:
    with group((3,), CustomWorker) as wg:
        assert wg.mapped(10) == 10 + 11 + 12
        assert wg.registered(2) == 2 + 4 + 6


class Collides(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def world_size(self) -> int:  # type: ignore[override]
        return 0


class CollidesWithGroupMethod(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def execute_all(self) -> int:
        return 0


@pytest.mark.parametrize("cls", [Collides, CollidesWithGroupMethod])
def test_a_method_named_like_a_group_attribute_is_an_error(cls: type[Worker]) -> None:
    with pytest.raises(MethodCollisionError, match=r"already an attribute of the worker group"):
        make_group((1,), cls)


def test_options_override_blocking_and_validate(wg: LocalWorkerGroup) -> None:
    fut = wg.one_to_all.options(blocking=False)("x")
    assert [f.get() for f in fut] == [(r, "x", None) for r in range(4)]
    assert wg.later.options(blocking=True)(5) == [5, 6, 7, 8]
    configured = wg.one_to_all.options(timeout=30)
    assert configured.call_options.timeout == 30.0
    assert configured.options(blocking=True).call_options.timeout == 30.0
    assert configured.options(timeout=None).call_options.timeout is None
    assert configured.options(timeout=None).call_options.has_timeout is True
    assert wg.one_to_all.call_options.has_timeout is False
    for bad in (0, -1, float("nan"), float("inf"), "3", True):
        with pytest.raises(InvalidCallOptionsError, match=r"one_to_all.options: timeout"):
            wg.one_to_all.options(timeout=bad)
    with pytest.raises(ConfigTypeError, match="blocking must be a bool"):
        wg.one_to_all.options(blocking="yes")
    with pytest.raises(TypeError):
        wg.one_to_all.options(blocking=1)


def test_typed_method_accessor(wg: LocalWorkerGroup) -> None:
    proxy = wg.method(EchoWorker.one_to_all)
    assert proxy("t", key=1) == [(r, "t", 1) for r in range(4)]
    with pytest.raises(UnknownMethodError, match="not a bound worker method"):
        wg.method(EchoWorker.not_registered)


def test_execute_all_and_rank_zero_api(wg: LocalWorkerGroup) -> None:
    """verl: execute_all / execute_rank_zero are the async forms (handles); the _sync forms
    return values."""
    handles = wg.execute_all("all_to_all", [1, 2, 3, 4])
    assert [h.result() for h in handles] == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert wg.execute_all_sync("all_to_all", "s") == [(r, "s") for r in range(4)]
    assert wg.execute_rank_zero("all_to_all", "z").result() == (0, "z")
    assert wg.execute_rank_zero_sync("all_to_all", [1, 2, 3, 4]) == (0, [1, 2, 3, 4])
    handles = wg.execute_all_async("all_to_all", "h")
    assert [h.result() for h in handles] == [(r, "h") for r in range(4)]
    assert wg.execute_rank_zero_async("all_to_all", "h").result() == (0, "h")


def test_verl_style_func_generator_hook() -> None:
    seen: list[tuple[str, bool]] = []

    class CustomGroup(LocalWorkerGroup):
        def _bind_worker_method(
            self, user_defined_cls: type, func_generator: Any = None
        ) -> list[str]:
            def generator(
                wg: WorkerGroup,
                method_name: str,
                *,
                dispatch_fn: Any,
                collect_fn: Any,
                execute_fn: Any,
                blocking: bool,
            ) -> Any:
                def call(*args: Any, **kwargs: Any) -> Any:
                    seen.append((method_name, blocking))
                    a, k = dispatch_fn(wg, *args, **kwargs)
                    handles = execute_fn(method_name, *a, **k)  # execute_all: handles
                    return collect_fn(wg, [h.result() for h in handles])

                return call

            return super()._bind_worker_method(user_defined_cls, generator)

    wg = CustomGroup(ResourcePool([2]), ClassWithInitArgs(EchoWorker))
    try:
        assert wg.one_to_all(1) == [(0, 1, None), (1, 1, None)]
        assert seen == [("one_to_all", True)]
    finally:
        wg.close()


def test_world_size_and_worker_names(wg: LocalWorkerGroup) -> None:
    assert wg.world_size == 4
    assert len(wg.worker_names) == 4
    assert all(isinstance(w, EchoWorker) for w in wg.workers)
    assert [w.rank for w in wg.workers] == [0, 1, 2, 3]


def test_binding_something_that_is_not_a_class_is_an_error(wg: LocalWorkerGroup) -> None:
    with pytest.raises(TypeError, match="_bind_worker_method: expected a class"):
        wg._bind_worker_method(object())  # type: ignore[arg-type]


CUSTOM_EXECUTE = Execute.register(unique_name("CORE_EXECUTE"))


class CustomExecute(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=CUSTOM_EXECUTE)
    def odd(self) -> int:  # pragma: no cover - never bound
        return 0


def test_an_execute_mode_without_an_execute_function_fails_at_binding() -> None:
    with pytest.raises(
        UnknownDispatchModeError, match=r"no execute mode .*known: \['ALL', 'RANK_ZERO'\]"
    ):
        make_group((1,), CustomExecute)


class OddDispatchError(DispatchArgumentError):
    def __init__(self, code: int) -> None:
        super().__init__(f"odd code {code}")


def _odd_dispatch(worker_group: Any, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
    raise OddDispatchError(7)


class OddDispatch(Worker):
    @register(dispatch_mode={"dispatch_fn": _odd_dispatch, "collect_fn": _sum_collect})
    def odd(self) -> int:  # pragma: no cover - never runs
        return 0


def test_dispatch_errors_keep_their_type() -> None:
    with group((1,), OddDispatch) as g, pytest.raises(OddDispatchError, match="odd code 7"):
        g.odd()


class _PropertyAndPlain(EchoWorker):
    @property
    def computed(self) -> int:  # a property: skipped, even though reading it on the class fails
        raise RuntimeError("never read on the class")

    def helper(self) -> int:  # not registered: skipped
        return 1


def test_seed_extension_point_binds_with_a_func_generator_and_no_backend_hooks() -> None:
    """verl's seam: a WorkerGroup subclass that sets its workers and calls
    ``_bind_worker_method(cls, func_generator)`` binds every registered method, skips
    properties and unregistered methods and returns the names, without implementing the
    backend hooks."""

    class ListGroup(WorkerGroup):
        def __init__(self, workers: list[Any]) -> None:
            super().__init__(resource_pool=None)
            self._workers = workers
            self.bound = self._bind_worker_method(_PropertyAndPlain, self._generator)

        def _generator(
            self,
            wg: WorkerGroup,
            method_name: str,
            *,
            dispatch_fn: Any,
            collect_fn: Any,
            execute_fn: Any,
            blocking: bool,
        ) -> Any:
            def call(*args: Any, **kwargs: Any) -> Any:
                a, k = dispatch_fn(wg, *args, **kwargs)
                per_rank = [
                    (tuple(x[r] for x in a), {n: v[r] for n, v in k.items()})
                    for r in range(wg.world_size)
                ]
                outs = [
                    getattr(w, method_name)(*pa, **pk)
                    for w, (pa, pk) in zip(self._workers, per_rank, strict=True)
                ]
                return collect_fn(wg, outs)

            return call

    with group((2,)) as local:
        wg = ListGroup(local.workers)
    assert "one_to_all" in wg.bound
    assert "shard_rows" in wg.bound
    assert "computed" not in wg.bound
    assert "helper" not in wg.bound
    assert wg.bound == sorted(wg.bound)
    assert wg.one_to_all("x") == [(0, "x", None), (1, "x", None)]
    with pytest.raises(NotImplementedError, match=r"ListGroup\.one_to_all: the group has no"):
        wg.execute_all_async("one_to_all", "x")
