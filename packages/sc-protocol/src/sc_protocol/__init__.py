"""sc-protocol: DataProto, the batch every stage exchanges, on TensorDict.

Importing this package registers DataProto, TensorDict and DataProtoFuture with
sc-dispatch, so that every splitting dispatch mode and the N-d mesh dispatch take them.
The exception tree is drawn in :mod:`sc_protocol._errors`; serialization is described in
:mod:`sc_protocol._serialize` (pickling) and :mod:`sc_protocol._disk` (files). tensordict is
imported first, without ``torch._dynamo`` (:mod:`sc_protocol._tensordict`), which keeps the
start-up of a worker process short.

This module holds what a user writes; :mod:`sc_protocol.ext` holds what a backend or a
dispatch mode needs beyond it (the shard adapters, the shard slices of futures, the pickled state
of a TensorDict).
"""

from sc_dispatch import _public

from . import _tensordict  # noqa: F401  (first: tensordict without torch._dynamo)
from ._adapters import register_adapters
from ._codec import (
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from ._collate import collate_fn
from ._columns import IndexLike
from ._config import DataProtoConfig
from ._data_proto import DataProto
from ._errors import (
    BatchSizeMismatchError,
    FutureError,
    IndexOutOfRangeError,
    InvalidSizeError,
    KeyConflictError,
    KeyMismatchError,
    MissingKeyError,
    ProtocolTypeError,
    ScProtocolError,
    SerializationError,
    UnknownRowCountError,
)
from ._fold import fold_batch_dim, unfold_batch_dim
from ._future import DataProtoFuture
from ._item import DataProtoItem
from ._padding import pad_dataproto_to_divisor, unpad_dataproto
from ._settings import SETTINGS
from ._union import union_numpy_dict, union_tensor_dict

__version__ = "0.2.0"

register_adapters()

__all__ = [
    "BatchSizeMismatchError",
    "DataProto",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoItem",
    "FutureError",
    "IndexLike",
    "IndexOutOfRangeError",
    "InvalidSizeError",
    "KeyConflictError",
    "KeyMismatchError",
    "MissingKeyError",
    "ProtocolTypeError",
    "SETTINGS",
    "ScProtocolError",
    "SerializationError",
    "UnknownRowCountError",
    "__version__",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "serialize_single_tensor",
    "serialize_tensordict",
    "unfold_batch_dim",
    "union_numpy_dict",
    "union_tensor_dict",
    "unpad_dataproto",
]

_public.publish(globals())

# The second tier, imported here so that its names report their public module from the start.
from . import ext  # noqa: E402, F401
