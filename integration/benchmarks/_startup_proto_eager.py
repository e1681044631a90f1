"""Start-up benchmark: the realistic worker of ``_startup_proto`` as it started before
sc-protocol deferred tensordict's ``torch.compile`` marks: tensordict is imported plainly
(``torch._dynamo`` with it) before sc_protocol, which then leaves it alone."""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import tensordict  # noqa: E402, F401
from _startup_proto import EchoWorker  # noqa: E402
from _startup_stats import imported  # noqa: E402

imported(__name__, _STARTED)


class EagerEchoWorker(EchoWorker):
    """``EchoWorker`` behind a plain ``import tensordict``."""
