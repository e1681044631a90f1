"""``python -m sc_rollout toy ...``: a rollout server in a process of its own.

The process binds its server, prints one JSON line ``{"sc_rollout_server": "<url>"}`` on
stdout once it accepts requests (what :class:`~sc_rollout.ServerProcess` waits for), then
serves until it is terminated. Logs go to stderr.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from collections.abc import Sequence

from ._engine import RolloutEngine
from ._server import RolloutServer
from ._toy import ToyEngine, ToyEngineConfig

__all__ = ["READY_KEY", "main", "serve", "toy_argv"]

#: the key of the line a server process prints when it is ready
READY_KEY = "sc_rollout_server"


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


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m sc_rollout", description="Serve a rollout engine over HTTP."
    )
    engines = parser.add_subparsers(dest="engine", required=True)
    toy = engines.add_parser("toy", help="the toy engine (tests and reference; no model)")
    toy.add_argument("--host", default=None, help="address to bind (default SC_ROLLOUT_HOST)")
    toy.add_argument("--port", type=int, default=0, help="port (0: a free one)")
    defaults = ToyEngineConfig()
    toy.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    toy.add_argument("--context-length", type=int, default=defaults.context_length)
    toy.add_argument("--token-delay-s", type=float, default=defaults.token_delay_s)
    toy.add_argument("--seed", type=int, default=defaults.seed)
    toy.add_argument("--model", default=defaults.model)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    config = ToyEngineConfig(
        vocab_size=args.vocab_size,
        context_length=args.context_length,
        token_delay_s=args.token_delay_s,
        seed=args.seed,
        model=args.model,
    )
    return serve(ToyEngine(config), host=args.host, port=args.port)


def serve(engine: RolloutEngine, *, host: str | None = None, port: int = 0) -> int:
    """Serve ``engine`` over HTTP in this process until it is terminated (SIGTERM, or
    Ctrl-C): the body of a server process's ``main``. Once the server accepts requests it
    prints the ready line ``{"sc_rollout_server": "<url>"}`` on stdout, which
    :class:`~sc_rollout.ServerProcess` waits for. SIGTERM shuts the server down in order,
    and then the engine, if it has a ``close()`` (a vLLM engine stops its engine-core
    processes there). Returns the exit status (0)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    server = RolloutServer(engine, host=host, port=port)
    sys.stdout.write(json.dumps({READY_KEY: server.url}) + "\n")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        close = getattr(engine, "close", None)
        if callable(close):
            close()
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)
