"""The exceptions sc-workers raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses
:class:`ScWorkersError` and exactly one builtin exception, the one it means, so callers may
catch either the sc-workers class or the builtin::

    ScWorkersError (Exception)                    base class of everything below
    ├── ConfigError (ValueError)                  a configuration value that is out of range
    │                                             or inconsistent: a batch size that is not
    │                                             divisible by the dp size or the micro-batch
    │                                             size, heads not divisible by the tp size, a
    │                                             model.path that is not a model directory
    ├── UnsupportedParallelismError               a layout this release cannot run (TP on a
    │   (NotImplementedError)                     Hugging Face model without Llama-style
    │                                             decoder layers, tied embeddings split over
    │                                             pipeline stages)
    ├── BatchError (ValueError)                   a DataProto a worker method cannot use: a
    │                                             batch size that does not split into the
    │                                             configured mini-/micro-batches, mismatched
    │                                             shapes, a bad meta_info value
    ├── MissingBatchKeyError (KeyError)           a tensor the method needs is not in the batch
    ├── DistributedError (RuntimeError)           the process group cannot be set up: a world
    │                                             size that does not match the one already
    │                                             initialised, missing MASTER_ADDR/MASTER_PORT
    │                                             for a multi-rank group, an unknown backend
    ├── NotInitializedError (RuntimeError)        a worker method called before ``init_model``,
    │                                             or one the worker's role does not provide
    ├── SyncLayoutError (ValueError)              two layouts a weight sync cannot map: a tensor
    │                                             missing on one side, different full shapes,
    │                                             a trainer layout that does not cover a tensor
    ├── WeightSyncError (RuntimeError)            a weight sync failed (a rank died, a piece did
    │                                             not fit); names the rank and the version, and
    │                                             the rollout keeps its previous weights
    ├── CollectiveAbortedError (RuntimeError)     a worker method whose collectives were
    │   │                                         aborted: another rank failed in the same
    │   │                                         call and tore the process groups down, so
    │   │                                         this rank's collective failed at once;
    │   │                                         names the failed rank and its error, and
    │   │                                         the next call rebuilds the groups
    │   └── PipelineStageError                    a pipeline stage failed inside a schedule
    │                                             (its own error, or a peer stage's: the
    │                                             pipeline group was torn down); names the
    │                                             rank and its stages (a peer's: the rank
    │                                             that failed)
    ├── CheckpointError (RuntimeError)            a checkpoint that is missing or incomplete (a
    │                                             rank's file, a parameter no saved rank holds,
    │                                             saved blocks that leave a gap), of another
    │                                             model (parameter names or shapes), or of
    │                                             format 1 at another layout; a Hugging Face
    │                                             export that cannot be written
    └── OptionalDependencyError (ImportError)     an optional extra that is not installed
                                                  (``sc-workers[hf]`` for transformers)

"""

from __future__ import annotations

__all__ = [
    "BatchError",
    "CheckpointError",
    "CollectiveAbortedError",
    "ConfigError",
    "DistributedError",
    "MissingBatchKeyError",
    "NotInitializedError",
    "OptionalDependencyError",
    "PipelineStageError",
    "ScWorkersError",
    "SyncLayoutError",
    "UnsupportedParallelismError",
    "WeightSyncError",
]


class ScWorkersError(Exception):
    """Base class of every error raised by sc-workers."""


class ConfigError(ScWorkersError, ValueError):
    """A configuration value that is out of range or inconsistent with another one."""


class UnsupportedParallelismError(ScWorkersError, NotImplementedError):
    """A parallel layout this release does not implement (for example pipeline parallelism)."""


class BatchError(ScWorkersError, ValueError):
    """A batch that a worker method cannot process."""


class MissingBatchKeyError(ScWorkersError, KeyError):
    """A tensor that a worker method needs is missing from the batch."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class DistributedError(ScWorkersError, RuntimeError):
    """The torch.distributed process group cannot be set up as requested."""


class NotInitializedError(ScWorkersError, RuntimeError):
    """A worker method called before ``init_model`` or outside the worker's role."""


class CollectiveAbortedError(ScWorkersError, RuntimeError):
    """A worker method's collectives were aborted because another rank of its group failed.

    The failed rank published its rank and error in the group's store and tore its process
    groups down, so this rank's collective failed within seconds instead of waiting for
    ``SC_WORKERS_PG_TIMEOUT_S``; this rank tore its groups down too, and the worker's next
    call rebuilds them (the model, optimizer and schedule are kept). ``failed_rank`` is the
    rank that failed (``None`` when no rank said: a rank that died), ``root_error`` its error
    as ``Type: message``. ``sc_caused_by_peer`` is true: sc-core reports the failed rank's own
    error when several ranks fail in one call."""

    sc_caused_by_peer: bool = True

    def __init__(
        self, message: str, *, failed_rank: int | None = None, root_error: str = ""
    ) -> None:
        super().__init__(message)
        self.failed_rank = failed_rank
        self.root_error = root_error

    def __reduce__(self) -> tuple[object, ...]:  # keep the fields through pickling (Ray)
        state = dict(self.__dict__)
        return (type(self), (str(self),), state)


class PipelineStageError(CollectiveAbortedError):
    """A pipeline stage failed inside a schedule; the pipeline group was torn down.

    ``sc_caused_by_peer`` is true on the stages that failed because a peer stage did (sc-core
    then reports the peer's own error when several ranks fail in one call); there
    ``failed_rank`` names the stage that failed, when it said."""

    sc_caused_by_peer: bool = False


class CheckpointError(ScWorkersError, RuntimeError):
    """A checkpoint that cannot be written or read back."""


class OptionalDependencyError(ScWorkersError, ImportError):
    """An optional dependency (an extra of sc-workers) is not installed."""


class SyncLayoutError(ScWorkersError, ValueError):
    """The trainer's and the rollout's layouts cannot be mapped onto each other."""


class WeightSyncError(ScWorkersError, RuntimeError):
    """A weight sync failed; the rollout still serves the previous version. ``group``
    (``"trainer"`` or ``"rollout"``) and ``rank`` say where, ``version`` which version;
    each is ``None`` where the failure has no such place (a bad setting, a timeout of the
    whole sync)."""

    def __init__(
        self,
        message: str,
        *,
        rank: int | None = None,
        version: int | None = None,
        group: str | None = None,
    ):
        super().__init__(message)
        self.rank = rank
        self.version = version
        self.group = group

    def __reduce__(self) -> tuple[object, ...]:  # keep rank, version and group through pickling
        state = {"rank": self.rank, "version": self.version, "group": self.group}
        return (type(self), (str(self),), state)
