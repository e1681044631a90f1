"""The exceptions sc-protocol raises.

Every error is raised explicitly (never through ``assert``). Each class subclasses the
package's base :class:`ScProtocolError` and exactly one builtin exception, the one it means,
so callers may catch either::

    ScProtocolError (Exception)                 base class of everything below
    ├── BatchSizeMismatchError (ValueError)     columns, parts or operands whose row counts
    │                                           (first dimensions) disagree
    ├── KeyConflictError (ValueError)           one key with two different values (union, or
    │                                           ``meta_info`` in concat), or a rename onto a
    │                                           key that is taken
    ├── KeyMismatchError (ValueError)           batches joined by concat with different keys,
    │                                           or one key with different dtypes or shapes
    ├── MissingKeyError (KeyError)              select / pop / rename of a key that is absent
    ├── IndexOutOfRangeError (IndexError)       a row index outside the batch, or one that
    │                                           would wrap around (``2**64 - 1``)
    ├── InvalidSizeError (ValueError)           a chunk count, split size, mini-batch size,
    │                                           padding or repeat count that cannot be used
    │                                           (a batch that does not divide evenly), or
    │                                           concat of an empty list
    ├── ProtocolTypeError (TypeError)           an argument of the wrong type: a column that is
    │                                           not a tensor / numpy array, a bad index type
    ├── SerializationError (ValueError)         a file that is not a saved DataProto, one that
    │                                           needs full unpickling when only safe loading
    │                                           was allowed, or a value that cannot be pickled
    └── FutureError (ValueError)                a DataProtoFuture whose resolver returned the
        │                                       wrong number, type or size of shards
        └── UnknownRowCountError                an operation that needs the row count of a
                                                future whose shard sizes are not known

Messages name the key, the sizes and the offending value.
"""

from __future__ import annotations

__all__ = [
    "BatchSizeMismatchError",
    "FutureError",
    "IndexOutOfRangeError",
    "InvalidSizeError",
    "KeyConflictError",
    "KeyMismatchError",
    "MissingKeyError",
    "ProtocolTypeError",
    "ScProtocolError",
    "SerializationError",
    "UnknownRowCountError",
]


class ScProtocolError(Exception):
    """Base class of every error raised by sc-protocol."""


class BatchSizeMismatchError(ScProtocolError, ValueError):
    """Columns, parts or operands whose numbers of rows disagree."""


class KeyConflictError(ScProtocolError, ValueError):
    """The same key with two different values, or a rename onto a taken key."""


class KeyMismatchError(ScProtocolError, ValueError):
    """Batches with different sets of keys where the same keys are required."""


class MissingKeyError(ScProtocolError, KeyError):
    """A key that is not in the batch."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class IndexOutOfRangeError(ScProtocolError, IndexError):
    """A row index outside ``[-len, len)``."""


class InvalidSizeError(ScProtocolError, ValueError):
    """A count or size argument that cannot be used with this batch."""


class ProtocolTypeError(ScProtocolError, TypeError):
    """An argument of the wrong type."""


class SerializationError(ScProtocolError, ValueError):
    """A saved or pickled DataProto that cannot be restored."""


class FutureError(ScProtocolError, ValueError):
    """A DataProtoFuture that cannot produce its value."""


class UnknownRowCountError(FutureError):
    """An operation that needs the row count of a future whose shard sizes are unknown."""
