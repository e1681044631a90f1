"""``ServerProcess``: a rollout server in a child process, started and waited for."""

from __future__ import annotations

import json
import logging
import os
import queue
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence

from .._errors import RolloutServerError, RolloutTimeoutError, RolloutTypeError, ScRolloutError
from .._settings import START_TIMEOUT, VLLM_START_TIMEOUT
from ..engines._toy import ToyEngineConfig
from ..engines._vllm_config import VLLMEngineConfig, vllm_argv, vllm_env_vars
from ..engines._vllm_env import Flavor, find_vllm_env
from ._cli import ERROR_KEY, READY_KEY, toy_argv
from ._client import check_timeout
from ._http import check_host
from ._wire import ERROR_CLASSES

__all__ = ["ServerProcess"]

_log = logging.getLogger("sc_rollout.process")


class ServerProcess:
    """A server process started from ``argv``, which prints ``{"sc_rollout_server": url}``
    on one line of stdout once it accepts requests (``python -m sc_rollout`` does).

    The constructor returns once that line came (:attr:`url`), or raises
    :class:`RolloutServerError` if the process exits first and :class:`RolloutTimeoutError`
    (the process killed) after ``start_timeout_s`` (default ``SC_ROLLOUT_START_TIMEOUT_S``).
    ``env`` replaces the child's environment. :meth:`kill` is a crash (SIGKILL),
    :meth:`stop` a shutdown (SIGTERM, and SIGKILL after ``stop_timeout_s``, by default 5 s;
    a vLLM server gets 60 s to stop its engine-core processes); ``with`` stops it.
    """

    def __init__(
        self,
        argv: Sequence[str],
        *,
        start_timeout_s: float | None = None,
        env: Mapping[str, str] | None = None,
        stop_timeout_s: float = 5.0,
    ) -> None:
        if isinstance(argv, str) or not all(isinstance(a, str) for a in argv):
            raise RolloutTypeError(f"ServerProcess(argv=...) must be a list of str, got {argv!r}")
        timeout = check_timeout(
            start_timeout_s, START_TIMEOUT.get(), "ServerProcess start_timeout_s"
        )
        self._argv = list(argv)
        self._stop_timeout = check_timeout(stop_timeout_s, 5.0, "ServerProcess stop_timeout_s")
        self._proc = subprocess.Popen(
            self._argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env=None if env is None else dict(env),
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(
            target=self._read, name=f"sc-rollout-process-{self._proc.pid}", daemon=True
        )
        self._reader.start()
        try:
            self._url = self._wait_ready(timeout)
        except BaseException:
            self.kill()
            raise

    @classmethod
    def toy(
        cls,
        config: ToyEngineConfig | None = None,
        *,
        host: str | None = None,
        port: int = 0,
        start_timeout_s: float | None = None,
    ) -> ServerProcess:
        """A toy-engine server (``python -m sc_rollout toy``) with ``config``."""
        bind = check_host(host, "ServerProcess.toy")
        return cls(
            toy_argv(config or ToyEngineConfig(), bind, port), start_timeout_s=start_timeout_s
        )

    @classmethod
    def vllm(
        cls,
        config: VLLMEngineConfig,
        *,
        host: str | None = None,
        port: int = 0,
        flavor: Flavor | None = None,
        start_timeout_s: float | None = None,
    ) -> ServerProcess:
        """A vLLM engine's server (``python -m sc_rollout vllm``) run by the vLLM
        environment's interpreter. :class:`EngineNotInstalledError` (naming the command that
        makes it) when the environment is not there; the engine's own errors (a model vLLM
        cannot serve) come back as their classes. ``start_timeout_s`` defaults to
        ``SC_ROLLOUT_VLLM_START_TIMEOUT_S``."""
        if not isinstance(config, VLLMEngineConfig):
            raise RolloutTypeError(
                f"ServerProcess.vllm: config must be a VLLMEngineConfig, got {config!r}"
            )
        env = find_vllm_env(flavor)
        bind = check_host(host, "ServerProcess.vllm")
        timeout = check_timeout(
            start_timeout_s, VLLM_START_TIMEOUT.get(), "ServerProcess.vllm start_timeout_s"
        )
        return cls(
            vllm_argv(config, str(env.python), bind, port),
            start_timeout_s=timeout,
            env=vllm_env_vars(config, os.environ),
            stop_timeout_s=60.0,
        )

    def _read(self) -> None:
        stdout = self._proc.stdout
        if stdout is not None:
            for line in stdout:
                self._lines.put(line)
        self._lines.put(None)

    def _wait_ready(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(left, 0.0))
            except queue.Empty:
                raise RolloutTimeoutError(
                    f"server process {self._argv[:4]} (pid {self._proc.pid}) was not ready "
                    f"within {timeout:g} s"
                ) from None
            if line is None:
                code = self._proc.wait()
                raise RolloutServerError(
                    f"server process {self._argv[:4]} (pid {self._proc.pid}) exited with "
                    f"{code} before it was ready (its stderr has the reason)"
                )
            try:
                ready = json.loads(line)
            except json.JSONDecodeError:
                ready = None
            if isinstance(ready, dict) and isinstance(ready.get(ERROR_KEY), dict):
                raise self._start_error(ready[ERROR_KEY])
            if isinstance(ready, dict) and isinstance(ready.get(READY_KEY), str):
                url: str = ready[READY_KEY]
                _log.debug("server process %d ready at %s", self._proc.pid, url)
                return url
            _log.debug("server process %d: %s", self._proc.pid, line.rstrip())

    def _start_error(self, error: dict[str, object]) -> ScRolloutError:
        """The typed error a server process reported before it exited."""
        self._proc.wait()
        kind, message = error.get("type"), error.get("message")
        cls = ERROR_CLASSES.get(kind) if isinstance(kind, str) else None
        where = f"server process {self._argv[:4]} (pid {self._proc.pid})"
        if cls is None:
            return RolloutServerError(f"{where} could not start its engine: {kind}: {message}")
        return cls(f"{where} could not start its engine: {message}")

    @property
    def url(self) -> str:
        return self._url

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self._proc.poll() is None

    def __repr__(self) -> str:
        state = "alive" if self.alive() else f"exited {self._proc.returncode}"
        return f"ServerProcess({getattr(self, '_url', '?')}, pid={self._proc.pid}, {state})"

    def kill(self) -> None:
        """SIGKILL, as a crash would: connections are reset, nothing is answered."""
        if self.alive():
            self._proc.kill()
        self._proc.wait()

    def stop(self, timeout_s: float | None = None) -> None:
        """SIGTERM, then SIGKILL after ``timeout_s`` (default: the ``stop_timeout_s`` it
        was started with)."""
        if self.alive():
            self._proc.terminate()
            try:
                self._proc.wait(self._stop_timeout if timeout_s is None else timeout_s)
            except subprocess.TimeoutExpired:
                _log.warning("server process %d ignored SIGTERM; killing it", self._proc.pid)
        self.kill()

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
