"""sc-ray pieces that need no cluster: import weight, option merging, byte estimates,
argument checks, the exception tree."""

from __future__ import annotations

import subprocess
import sys

import pytest
import sc_core
import sc_ray._errors
from hypothesis import given, settings
from hypothesis import strategies as st
from sc_dispatch._setting import SettingValueError
from sc_ray import (
    RESERVED_ENV_VARS,
    DetachedWorkerError,
    InsufficientResourcesError,
    PlacementTimeoutError,
    RayClassWithInitArgs,
    RayResourcePool,
    RayResourcePoolError,
    RayWorkerGroup,
    ScRayError,
    WorkerEnvError,
)
from sc_ray._actor_launch import check_worker_env
from sc_ray._class_with_init import merge_options
from sc_ray._nbytes import estimate_nbytes, is_bulk

pytestmark = pytest.mark.timeout(60)


def test_import_pulls_in_nothing_heavy() -> None:
    code = (
        "import sys, sc_ray\n"
        "heavy = [m for m in ('torch', 'sc_protocol', 'tensordict', 'numpy') if m in sys.modules]\n"
        "sys.exit(1 if heavy else 0)\n"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False, timeout=50).returncode == 0


MEANINGS = (ValueError, TypeError, KeyError, LookupError, TimeoutError, OSError, RuntimeError)


def _meanings(exc: type[BaseException]) -> list[type[BaseException]]:
    found = [m for m in MEANINGS if issubclass(exc, m)]
    return [m for m in found if not any(o is not m and issubclass(o, m) for o in found)]


@pytest.mark.parametrize(
    ("exc", "meaning"),
    [
        (RayResourcePoolError, ValueError),
        (InsufficientResourcesError, ValueError),
        (PlacementTimeoutError, TimeoutError),
        (WorkerEnvError, ValueError),
        (DetachedWorkerError, LookupError),
    ],
)
def test_each_error_means_exactly_one_builtin(exc: type[Exception], meaning: type) -> None:
    assert issubclass(exc, ScRayError)
    assert _meanings(exc) == [meaning]
    assert exc.__name__ in (sc_ray._errors.__doc__ or "")


def test_exception_tree() -> None:
    assert issubclass(RayResourcePoolError, sc_core.ResourcePoolError)
    assert issubclass(InsufficientResourcesError, RayResourcePoolError)
    assert not issubclass(PlacementTimeoutError, RayResourcePoolError)
    assert ScRayError.__bases__ == (Exception,)


@given(
    st.dictionaries(st.sampled_from("ABC"), st.text(max_size=3)),
    st.dictionaries(st.sampled_from("BCD"), st.text(max_size=3)),
)
@settings(deadline=None, max_examples=50)
def test_merge_options_merges_env_vars(first: dict[str, str], second: dict[str, str]) -> None:
    merged = merge_options(
        {"runtime_env": {"env_vars": first, "pip": ["a"]}, "num_cpus": 1},
        {"runtime_env": {"env_vars": second}, "num_cpus": 2},
    )
    assert merged["runtime_env"]["env_vars"] == {**first, **second}
    assert merged["runtime_env"]["pip"] == ["a"]
    assert merged["num_cpus"] == 2


def test_bulk_detection_and_byte_estimates() -> None:
    assert is_bulk(b"x" * 200_000)
    assert not is_bulk(b"x" * 10)
    assert not is_bulk([1, 2, 3])
    assert estimate_nbytes([b"ab", {"k": b"cde"}]) == 5
    assert estimate_nbytes(None) == 0
    assert estimate_nbytes(object()) == 0


def test_arguments_checked_before_touching_ray() -> None:
    with pytest.raises(WorkerEnvError, match="WORLD_SIZE"):
        check_worker_env({"WORLD_SIZE": "2"})
    with pytest.raises(WorkerEnvError, match="str"):
        check_worker_env({"A": 1})  # type: ignore[dict-item]
    assert check_worker_env({"A": "1"}) == {"A": "1"}
    assert "MASTER_PORT" in RESERVED_ENV_VARS
    with pytest.raises(sc_core.InvalidConfigError, match="ray_cls_with_init"):
        RayWorkerGroup(RayResourcePool([1], use_gpu=False))
    with pytest.raises(sc_core.ConfigTypeError, match="RayClassWithInitArgs"):
        RayWorkerGroup(
            RayResourcePool([1], use_gpu=False),
            sc_core.ClassWithInitArgs(sc_core.Worker),  # type: ignore[arg-type]
        )
    with pytest.raises(sc_core.InvalidConfigError, match="worker_names"):
        RayWorkerGroup()
    with pytest.raises(sc_core.InvalidConfigError, match="start_timeout"):
        RayWorkerGroup(worker_handles=[], start_timeout=-1)
    for addr, port, which in (("127.0.0.1", None, "master_addr"), (None, 1234, "master_port")):
        with pytest.raises(ValueError, match=rf"{which} was given without"):
            RayWorkerGroup(worker_handles=[], master_addr=addr, master_port=port)


def test_start_timeout_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SC_RAY_WORKER_START_TIMEOUT_S", "later")
    with pytest.raises(SettingValueError, match=r"SC_RAY_WORKER_START_TIMEOUT_S='later'"):
        RayWorkerGroup(worker_handles=[])
    monkeypatch.delenv("SC_RAY_WORKER_START_TIMEOUT_S")
    monkeypatch.setenv("SC_WORKER_START_TIMEOUT", "soon")  # sc 0.1's name is not read
    RayWorkerGroup(worker_handles=[])


def test_class_with_init_args_unwraps_and_validates() -> None:
    cls = RayClassWithInitArgs(sc_core.Worker)
    assert cls.worker_cls is sc_core.Worker
    assert cls.options == {}
    with pytest.raises(RayResourcePoolError, match="bad entry"):
        cls.set_additional_resource({"a": True})
    assert "Worker" in repr(cls)


def test_a_detached_groups_control_calls_go_to_the_control_concurrency_group() -> None:
    """sc-core's control lane (its queries, calls answered from the journal) runs in the
    actors' ``sc_control`` concurrency group, which only a detached group's actors have;
    every other call, and every call of a group without the lane, in the default group."""
    from sc_core.backend import JOURNAL_LANE_KWARG
    from sc_ray._actor_class import CONTROL_GROUP
    from sc_ray._ray_backend import RayBackend

    def backend(control_lane: bool) -> RayBackend:
        return RayBackend(
            "g",
            [],
            frozenset(),
            release_attached_pgs=False,
            probe_timeout=1.0,
            control_lane=control_lane,
        )

    lane = backend(True)._lane
    assert CONTROL_GROUP == "sc_control"
    assert lane("_sc_journal_calls", (None,), {}) == CONTROL_GROUP
    assert lane("actor__sc_last_calls", (), {}) == CONTROL_GROUP  # a colocated role's
    assert lane("update_actor", (), {JOURNAL_LANE_KWARG: True}) == CONTROL_GROUP
    assert lane("update_actor", (), {}) is None
    assert lane("update_actor", (), {JOURNAL_LANE_KWARG: False}) is None
    assert backend(False)._lane("_sc_journal_calls", (None,), {}) is None
