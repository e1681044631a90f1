"""An engine behind HTTP, in this process or in one of its own, and a server seen as an engine.

:class:`RolloutServer` puts any engine behind an OpenAI-compatible token-in-token-out
endpoint (``POST /v1/completions`` with ``prompt`` a list of token ids) plus control
endpoints; :func:`serve` runs one until SIGTERM (what ``python -m sc_rollout serve`` does);
:class:`ServerProcess` runs one in a process of its own; :class:`RolloutClient` is a server
seen as a :class:`~sc_rollout.engines.RolloutEngine`.
"""

from __future__ import annotations

from sc_dispatch import _public

from ._cli import serve
from ._client import RolloutClient
from ._process import ServerProcess
from ._server import RolloutServer

__all__ = ["RolloutClient", "RolloutServer", "ServerProcess", "serve"]

_public.publish(globals())
