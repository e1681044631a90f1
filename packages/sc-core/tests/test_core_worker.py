"""Worker: environment, visible devices, rendezvous, worker contexts."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any, ClassVar

import pytest
from _core_fakes import group, make_group
from sc_core import (
    MethodCollisionError,
    MissingEnvironmentError,
    VisibleDevicesError,
    Worker,
    WorkerEnvironmentError,
    worker_environ,
)
from sc_core.backend import (
    InProcessRendezvous,
    Rendezvous,
    RendezvousError,
    RendezvousTimeoutError,
    current_worker_context,
    free_port,
    rendezvous_from_env,
    worker_context,
)
from sc_core.ext import RESERVED_WORKER_ATTRS, normalize_visible_devices
from sc_core.verl import DistGlobalInfo, DistRankInfo
from sc_dispatch import Dispatch, register
from sc_dispatch._setting import SettingValueError


def make(env: MutableMapping[str, str], rendezvous: Rendezvous | None = None) -> Worker:
    with worker_context(env, rendezvous):
        return Worker()


def test_a_worker_reads_its_own_environment_not_the_process_one() -> None:
    before = dict(os.environ)
    env = {"WORLD_SIZE": "4", "RANK": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    w = make(env)
    assert (w.rank, w.world_size) == (2, 4)
    assert w.get_master_addr_port() == ("h", "1")
    assert w._sc_environ() is env
    assert env["LOCAL_WORLD_SIZE"] == "1"
    assert env["LOCAL_RANK"] == "0"
    assert dict(os.environ) == before
    assert w.get_cuda_visible_devices() == "not set"
    env["CUDA_VISIBLE_DEVICES"] = "3"
    assert w.get_cuda_visible_devices() == "3"
    assert "MASTER_PORT" in Worker.env_keys()


def test_without_a_context_the_process_environment_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    monkeypatch.delenv("SC_RENDEZVOUS", raising=False)
    w = Worker()
    assert w._sc_environ() is os.environ
    assert w.get_master_addr_port() == (None, None)
    assert worker_environ() is os.environ
    assert current_worker_context() is None


@pytest.mark.parametrize(
    ("env", "error", "match"),
    [
        ({"RANK": "0"}, MissingEnvironmentError, "WORLD_SIZE is not set"),
        ({"WORLD_SIZE": "2"}, MissingEnvironmentError, "RANK is not set"),
        (
            {"WORLD_SIZE": "two", "RANK": "0"},
            WorkerEnvironmentError,
            "WORLD_SIZE must be an integer",
        ),
        ({"WORLD_SIZE": "0", "RANK": "0"}, WorkerEnvironmentError, "WORLD_SIZE must be >= 1"),
        (
            {"WORLD_SIZE": "2", "RANK": "2"},
            WorkerEnvironmentError,
            "RANK=2 is not below WORLD_SIZE=2",
        ),
        ({"WORLD_SIZE": "2", "RANK": "-1"}, WorkerEnvironmentError, "RANK must be >= 0"),
        (
            {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "1"},
            WorkerEnvironmentError,
            r"\(rank 1\): LOCAL_RANK=1 is not below LOCAL_WORLD_SIZE=1",
        ),
    ],
)
def test_bad_environments_are_errors(
    env: dict[str, str], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        make(env)


def test_missing_environment_error_is_a_key_error_with_a_readable_message() -> None:
    with pytest.raises(KeyError) as info:
        make({})
    assert str(info.value).startswith("Worker.__init__: WORLD_SIZE is not set")


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({"HIP_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "0,1"}),
        ({"HIP_VISIBLE_DEVICES": "2", "CUDA_VISIBLE_DEVICES": "2"}, {"CUDA_VISIBLE_DEVICES": "2"}),
        ({"ROCR_VISIBLE_DEVICES": "1"}, {"CUDA_VISIBLE_DEVICES": "1"}),
        ({"CUDA_VISIBLE_DEVICES": "5"}, {"CUDA_VISIBLE_DEVICES": "5"}),
        ({}, {}),
    ],
)
def test_visible_devices_are_folded_into_cuda(
    env: dict[str, str], expected: dict[str, str]
) -> None:
    normalize_visible_devices(env)
    assert env == expected


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "1"}, "disagree"),
        ({"ROCR_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "0"}, "together with CUDA"),
        ({"ROCR_VISIBLE_DEVICES": "0", "HIP_VISIBLE_DEVICES": "0"}, "together with HIP"),
    ],
)
def test_contradicting_visible_devices_are_errors_that_change_nothing(
    env: dict[str, str], match: str
) -> None:
    before = dict(env)
    with pytest.raises(VisibleDevicesError, match=match):
        normalize_visible_devices(env, "MyWorker")
    assert env == before
    with pytest.raises(VisibleDevicesError, match=r"Worker.__init__"):
        make({"WORLD_SIZE": "1", "RANK": "0", **env})


def test_rendezvous_hands_rank_zeros_address_to_the_others() -> None:
    rdv = InProcessRendezvous()
    zero = make({"WORLD_SIZE": "2", "RANK": "0"}, rdv)
    addr, port = zero.get_master_addr_port()
    assert addr
    assert port
    assert int(port) > 0
    one = make({"WORLD_SIZE": "2", "RANK": "1"}, rdv)
    assert one.get_master_addr_port() == (addr, port)
    with pytest.raises(RendezvousError, match="already published"):
        rdv.publish({"MASTER_ADDR": "x", "MASTER_PORT": "1"})


def test_rank_zero_keeps_a_preset_address_and_other_ranks_need_not_wait() -> None:
    rdv = InProcessRendezvous()
    zero = make({"WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "a", "MASTER_PORT": "9"}, rdv)
    assert zero.get_master_addr_port() == ("a", "9")
    assert rdv.wait(0) == {"MASTER_ADDR": "a", "MASTER_PORT": "9"}
    other = make(
        {"WORLD_SIZE": "2", "RANK": "1", "MASTER_ADDR": "b", "MASTER_PORT": "8"},
        InProcessRendezvous(),
    )
    assert other.get_master_addr_port() == ("b", "8")


def test_a_rank_waits_for_rank_zero_across_threads() -> None:
    rdv = InProcessRendezvous()
    result: dict[str, Any] = {}

    def late_rank() -> None:
        result["w"] = make({"WORLD_SIZE": "2", "RANK": "1"}, rdv)

    thread = threading.Thread(target=late_rank)
    thread.start()
    zero = make({"WORLD_SIZE": "2", "RANK": "0"}, rdv)
    thread.join(30)
    assert result["w"].get_master_addr_port() == zero.get_master_addr_port()


def test_rendezvous_timeout_and_incomplete_publication() -> None:
    env = {"WORLD_SIZE": "2", "RANK": "1", "SC_CORE_RENDEZVOUS_TIMEOUT_S": "0.01"}
    with pytest.raises(RendezvousTimeoutError, match="did not publish"):
        make(dict(env), InProcessRendezvous())
    rdv = InProcessRendezvous()
    rdv.publish({"MASTER_ADDR": "a"})
    with pytest.raises(
        RendezvousError, match=r"rank 1\): rank 0 published .* without \['MASTER_PORT'\]"
    ):
        make(dict(env), rdv)
    with pytest.raises(
        SettingValueError,
        match=r"rank 1\): environment variable SC_CORE_RENDEZVOUS_TIMEOUT_S='soon'",
    ):
        make({**env, "SC_CORE_RENDEZVOUS_TIMEOUT_S": "soon"}, InProcessRendezvous())
    short = {"WORLD_SIZE": "2", "RANK": "1", "SC_CORE_RENDEZVOUS_TIMEOUT_S": "0.01"}
    with pytest.raises(RendezvousTimeoutError, match="did not publish"):
        make(short, InProcessRendezvous())


class _Recorded(Rendezvous):
    published: ClassVar[list[dict[str, str]]] = []

    def publish(self, info: Mapping[str, str]) -> None:
        self.published.append(dict(info))

    def wait(self, timeout: float | None) -> dict[str, str]:  # pragma: no cover - rank 0 only
        return {}


def rendezvous_factory(env: Mapping[str, str]) -> Rendezvous | None:
    """Used through SC_RENDEZVOUS below."""
    return _Recorded() if env.get("WANT") else None


def not_a_rendezvous(env: Mapping[str, str]) -> object:
    return object()


def test_sc_rendezvous_names_a_factory() -> None:
    spec = f"{__name__}:rendezvous_factory"
    _Recorded.published.clear()
    make({"WORLD_SIZE": "1", "RANK": "0", "SC_RENDEZVOUS": spec, "WANT": "1"})
    assert len(_Recorded.published) == 1
    make({"WORLD_SIZE": "1", "RANK": "0", "SC_RENDEZVOUS": spec})  # factory says: none
    assert len(_Recorded.published) == 1
    assert rendezvous_from_env({}) is None


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("no_colon", "must be 'package.module:factory'"),
        ("sc_core_no_such_module:f", "cannot be loaded: ModuleNotFoundError"),
        ("sc_core:no_such_factory", "cannot be loaded: AttributeError"),
        (f"{__name__}:not_a_rendezvous", "not a Rendezvous"),
    ],
)
def test_bad_sc_rendezvous(spec: str, match: str) -> None:
    with pytest.raises(WorkerEnvironmentError, match=match):
        rendezvous_from_env({"SC_RENDEZVOUS": spec})


def test_worker_helper_and_dist_info() -> None:
    w = make({"WORLD_SIZE": "1", "RANK": "0"})
    addr, port = w.get_availale_master_addr_port()
    assert addr
    assert int(port) > 0
    assert w._get_pid() == os.getpid()
    assert w.get_fused_worker_by_name("x") is None
    assert DistRankInfo(0, 1, 2, 3).dp_rank == 1
    assert DistGlobalInfo(1, 2, 3, 4).pp_size == 3


class PlainNames(Worker):
    """A worker whose registered methods have the names users write: none of them may
    break the base class or the group."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self, key: str) -> str | None:
        return worker_environ().get(key)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def rank(self) -> int:  # type: ignore[override]  # replaces the property, on purpose
        return int(self._rank) * 10

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def name(self) -> str:
        return f"worker-{self._rank}"

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def config(self, key: str, value: int) -> dict[str, int]:
        return {key: value}


class GroupName(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def world_size(self) -> str:  # type: ignore[override]
        return "mine"


def test_user_methods_may_use_the_names_users_write() -> None:
    with group((2,), PlainNames) as wg:
        assert wg.env("RANK") == ["0", "1"]
        assert wg.method(PlainNames.rank)() == [0, 10]
        assert wg.name() == ["worker-0", "worker-1"]
        assert wg.config("lr", 1) == [{"lr": 1}, {"lr": 1}]
    # The group's own API (world_size, execute_all, spawn, ...) is reserved on the group.
    with pytest.raises(MethodCollisionError, match=r"'world_size'.*rename the worker method"):
        make_group((1,), GroupName)


@pytest.mark.parametrize(
    "name", [*sorted(RESERVED_WORKER_ATTRS), "_sc_state", "_sc_environ", "_sc_mesh_tables"]
)
def test_defining_a_reserved_worker_name_fails_when_the_class_is_created(name: str) -> None:
    def method(self: Any) -> None:  # pragma: no cover - the class is never created
        return None

    with pytest.raises(MethodCollisionError, match=rf"worker class Bad defines \['{name}'\]"):
        type("Bad", (Worker,), {name: method})
    with pytest.raises(TypeError):
        type("Bad", (Worker,), {name: 1})


@pytest.mark.parametrize("host", ["", "127.0.0.1"])
def test_free_port_is_a_port_the_caller_can_bind(host: str) -> None:
    port = free_port(host)
    assert 1024 <= port <= 65535
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, port))  # free when asked: binding it now works
    assert Worker._get_free_port() != 0  # verl's name runs the same helper


def test_free_port_on_an_ipv6_host_binds_an_ipv6_socket() -> None:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6 support")
    try:
        port = free_port("::1")
    except OSError as exc:  # the machine has no IPv6 loopback
        pytest.skip(f"no IPv6 loopback here: {exc}")
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
        sock.bind(("::1", port))
