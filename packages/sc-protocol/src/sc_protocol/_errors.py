"""The exceptions sc-protocol raises.

Every error is raised explicitly (never through ``assert``) and subclasses the builtin
exception it means, so callers may catch either::

    ProtocolError (ValueError)                  base class of everything below
    ├── BatchSizeMismatchError                  columns, parts or operands whose row counts
    │                                           (first dimensions) disagree
    ├── KeyConflictError                        one key with two different values (union), or
    │                                           a rename onto a key that is taken
    ├── KeyMismatchError                        batches joined by concat with different keys
    ├── MissingKeyError (also KeyError)         select / pop / rename of a key that is absent
    ├── IndexOutOfRange (also IndexError)       a row index outside the batch
    ├── InvalidSizeError                        a chunk count, split size, mini-batch size,
    │                                           padding or repeat count that cannot be used,
    │                                           or concat of an empty list
    ├── ProtocolTypeError (also TypeError)      an argument of the wrong type: a column that is
    │                                           not a tensor / numpy array, a bad index type
    ├── SerializationError                      a file that is not a saved DataProto, or one
    │                                           that needs full unpickling when only
    │                                           ``weights_only`` loading was allowed
    └── FutureError                             a DataProtoFuture whose resolver returned the
        │                                       wrong number, type or size of shards
        └── UnknownRowCountError                an operation that needs the row count of a
                                                future whose shard sizes are not known

Messages name the key, the sizes and the offending value.
"""

from __future__ import annotations

__all__ = [
    "BatchSizeMismatchError",
    "FutureError",
    "IndexOutOfRange",
    "InvalidSizeError",
    "KeyConflictError",
    "KeyMismatchError",
    "MissingKeyError",
    "ProtocolError",
    "ProtocolTypeError",
    "SerializationError",
    "UnknownRowCountError",
]


class ProtocolError(ValueError):
    """Base class of every error raised by sc-protocol."""


class BatchSizeMismatchError(ProtocolError):
    """Columns, parts or operands whose numbers of rows disagree."""


class KeyConflictError(ProtocolError):
    """The same key with two different values, or a rename onto a taken key."""


class KeyMismatchError(ProtocolError):
    """Batches with different sets of keys where the same keys are required."""


class MissingKeyError(ProtocolError, KeyError):
    """A key that is not in the batch."""

    def __str__(self) -> str:
        # KeyError quotes its argument; show the message as written.
        return str(self.args[0]) if self.args else ""


class IndexOutOfRange(ProtocolError, IndexError):
    """A row index outside ``[-len, len)``."""


class InvalidSizeError(ProtocolError):
    """A count or size argument that cannot be used with this batch."""


class ProtocolTypeError(ProtocolError, TypeError):
    """An argument of the wrong type."""


class SerializationError(ProtocolError):
    """A saved or pickled DataProto that cannot be restored."""


class FutureError(ProtocolError):
    """A DataProtoFuture that cannot produce its value."""


class UnknownRowCountError(FutureError):
    """An operation that needs the row count of a future whose shard sizes are unknown."""
