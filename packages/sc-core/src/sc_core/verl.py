"""verl's worker helpers under their verl names (``verl.single_controller.base.worker``):
:class:`DistRankInfo` and :class:`DistGlobalInfo` (a worker's tp/dp/pp/cp ranks and sizes),
and :class:`WorkerHelper`, the base class of :class:`~sc_core.Worker`.

A verl program migrates by changing imports: ``Worker`` and the worker groups come from
:mod:`sc_core`, these from here.
"""

from sc_dispatch import _public

from ._worker import DistGlobalInfo, DistRankInfo, WorkerHelper

__all__ = ["DistGlobalInfo", "DistRankInfo", "WorkerHelper"]

_public.publish(globals())
