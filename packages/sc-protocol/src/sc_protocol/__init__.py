"""sc-protocol: DataProto, the batch every stage exchanges, on TensorDict.

Importing this package registers DataProto, TensorDict and DataProtoFuture with
sc-dispatch, so that every splitting dispatch mode and the N-d mesh dispatch take them.
The exception tree is drawn in :mod:`sc_protocol._errors`; serialization is described in
:mod:`sc_protocol._serialize` (pickling) and :mod:`sc_protocol._disk` (files). tensordict is
imported first, without ``torch._dynamo`` (:mod:`sc_protocol._tensordict`), which keeps the
start-up of a worker process short.
"""

from sc_dispatch import register_future_resolver

from . import _tensordict  # noqa: F401  (first: tensordict without torch._dynamo)
from ._adapters import (
    DataProtoAdapter,
    DataProtoFutureAdapter,
    TensorDictAdapter,
    register_adapters,
)
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
from ._plan import ShardSlice, plan_shard_slices
from ._resolve import Resolver
from ._serialize import rebuild_tensordict, tensordict_state
from ._settings import SETTINGS
from ._union import union_numpy_dict, union_tensor_dict

__version__ = "0.1.0"

register_adapters()

__all__ = [
    "SETTINGS",
    "BatchSizeMismatchError",
    "DataProto",
    "DataProtoAdapter",
    "DataProtoConfig",
    "DataProtoFuture",
    "DataProtoFutureAdapter",
    "DataProtoItem",
    "FutureError",
    "IndexLike",
    "IndexOutOfRangeError",
    "InvalidSizeError",
    "KeyConflictError",
    "KeyMismatchError",
    "MissingKeyError",
    "ProtocolTypeError",
    "ScProtocolError",
    "Resolver",
    "SerializationError",
    "ShardSlice",
    "TensorDictAdapter",
    "UnknownRowCountError",
    "__version__",
    "collate_fn",
    "deserialize_single_tensor",
    "deserialize_tensordict",
    "fold_batch_dim",
    "pad_dataproto_to_divisor",
    "plan_shard_slices",
    "register_adapters",
    "rebuild_tensordict",
    "unfold_batch_dim",
    "register_future_resolver",
    "tensordict_state",
    "union_numpy_dict",
    "serialize_single_tensor",
    "serialize_tensordict",
    "union_tensor_dict",
    "unpad_dataproto",
]
