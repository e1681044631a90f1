"""``python -m sc_workers.rollout --model DIR ...``: the built-in engine in a rollout server
process of its own (:func:`sc_rollout.serving.serve`: it prints the ready line that
:class:`sc_rollout.ServerProcess` waits for, and closes the engine at shutdown)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from sc_rollout.errors import RolloutTypeError
from sc_rollout.serving import serve

from ._config import DTYPES, TorchRolloutEngineConfig
from ._engine import TorchRolloutEngine

__all__ = ["main", "torch_engine_argv"]


def torch_engine_argv(
    config: TorchRolloutEngineConfig, host: str | None = None, port: int = 0
) -> list[str]:
    """The command line of a server process for the built-in engine with ``config`` (this
    interpreter), for :class:`sc_rollout.ServerProcess`. ``host`` ``None``: the server's
    default (``SC_ROLLOUT_HOST``); ``port`` 0: a free one."""
    if not isinstance(config, TorchRolloutEngineConfig):
        raise RolloutTypeError(
            f"torch_engine_argv() takes a TorchRolloutEngineConfig, got {type(config).__name__}"
        )
    argv = [sys.executable, "-m", "sc_workers.rollout", "--model", config.model]
    if host is not None:
        argv += ["--host", host]
    argv += [
        *("--port", str(port), "--device", config.device, "--dtype", config.dtype),
        *("--seed", str(config.seed), "--max-batch-size", str(config.max_batch_size)),
        *("--step-delay-s", repr(config.step_delay_s)),
        *("--exact-window", str(config.exact_window)),
    ]
    if config.name is not None:
        argv += ["--name", config.name]
    return argv


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sc_workers.rollout",
        description="Serve a local Hugging Face causal LM with the built-in rollout engine.",
    )
    defaults = TorchRolloutEngineConfig(model=".")
    parser.add_argument("--model", required=True, help="local Hugging Face model directory")
    parser.add_argument("--host", default=None, help="address to bind (default SC_ROLLOUT_HOST)")
    parser.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    parser.add_argument("--device", default=defaults.device, help="torch device (cpu, cuda:0)")
    parser.add_argument("--dtype", default=defaults.dtype, choices=sorted(DTYPES))
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--max-batch-size", type=int, default=defaults.max_batch_size)
    parser.add_argument("--step-delay-s", type=float, default=defaults.step_delay_s)
    parser.add_argument("--name", default=None, help="model name reported (default: dir name)")
    parser.add_argument(
        "--exact-window",
        type=int,
        default=defaults.exact_window,
        help="the exact mode's window in tokens (0: off): each request alone per step",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Build the engine from the command line and serve it until terminated."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = TorchRolloutEngineConfig(
        model=args.model,
        device=args.device,
        dtype=args.dtype,
        seed=args.seed,
        max_batch_size=args.max_batch_size,
        step_delay_s=args.step_delay_s,
        name=args.name,
        exact_window=args.exact_window,
    )
    return serve(TorchRolloutEngine(config), host=args.host, port=args.port)
