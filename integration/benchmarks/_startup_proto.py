"""Start-up benchmark: a realistic worker, whose module imports sc-protocol as worker code
does and whose first call receives and returns a DataProto.

``EchoWorker`` runs in a RayWorkerGroup (``DP_COMPUTE_PROTO``); ``BareProtoActor`` is the
same work on a bare Ray actor (sc-ray left out: it receives its shard directly).
"""

from __future__ import annotations

import time

_STARTED = time.perf_counter()

import torch  # noqa: E402
from _startup_stats import imported, process_stats  # noqa: E402
from sc_core import Worker  # noqa: E402
from sc_dispatch import Dispatch, register  # noqa: E402
from sc_protocol import DataProto  # noqa: E402

imported(__name__, _STARTED)


def _touch(data: DataProto) -> DataProto:
    """What a real method does at least: read a column, write one."""
    data.batch["y"] = data.batch["x"] * 2 + torch.ones(())
    return data


class EchoWorker(Worker):
    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def echo(self, data: DataProto) -> DataProto:
        return _touch(data)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def stats(self) -> dict[str, float]:
        return process_stats()


class BareProtoActor:
    def echo(self, data: DataProto) -> DataProto:
        return _touch(data)

    def stats(self) -> dict[str, float]:
        return process_stats()
