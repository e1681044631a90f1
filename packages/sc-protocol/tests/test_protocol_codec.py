"""verl's plain tensor encoding: serialize_single_tensor / serialize_tensordict round trips
for every dtype and shape, nested tensors, devices, and the errors of malformed input."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from _protocol_helpers import DTYPES, PROPERTY, make_tensor
from hypothesis import given
from hypothesis import strategies as st
from sc_protocol import (
    ProtocolTypeError,
    SerializationError,
    deserialize_single_tensor,
    deserialize_tensordict,
    serialize_single_tensor,
    serialize_tensordict,
)
from tensordict import TensorDict


@PROPERTY
@given(
    dtype=st.sampled_from([*DTYPES, torch.float64, torch.int32, torch.float8_e4m3fn]),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    seed=st.integers(0, 100),
)
def test_a_tensor_round_trips_bit_for_bit(dtype: torch.dtype, shape: list[int], seed: int) -> None:
    rows = shape[0] if shape else 1
    tensor = make_tensor(rows, tuple(shape[1:]), torch.float32, seed).to(dtype)
    if not shape:
        tensor = tensor.reshape(())
    name, encoded_shape, data = serialize_single_tensor(tensor)
    assert name == str(dtype).removeprefix("torch.")
    assert encoded_shape == tuple(tensor.shape)
    assert isinstance(data, np.ndarray)
    assert data.dtype == np.uint8
    back = deserialize_single_tensor((name, encoded_shape, data))
    assert back.dtype == dtype
    assert back.shape == tensor.shape
    assert torch.equal(back.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))


def test_a_decoded_tensor_owns_its_memory_and_views_are_encoded_by_their_rows() -> None:
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    view = base[:, 1:3]  # not contiguous
    back = deserialize_single_tensor(serialize_single_tensor(view))
    assert torch.equal(back, view)
    back += 1
    assert torch.equal(base, torch.arange(12, dtype=torch.float32).reshape(3, 4))


def test_a_tensordict_round_trips_with_nested_tensors_and_its_device() -> None:
    nested = torch.nested.as_nested_tensor([torch.randn(2, 3), torch.randn(1, 3)])  # strided
    td = TensorDict(
        {"x": torch.randn(2, 5, 4), "ids": torch.arange(10).reshape(2, 5), "j": nested},
        batch_size=[2],
        device="cpu",
    )
    batch_size, device, items = serialize_tensordict(td)
    assert batch_size == (2,)
    assert device == "cpu"
    assert items["j"][0] == "strided"
    back = deserialize_tensordict((batch_size, device, items))
    assert back.batch_size == td.batch_size
    assert back.device == td.device
    assert torch.equal(back["x"], td["x"])
    assert torch.equal(back["ids"], td["ids"])
    assert all(torch.equal(a, b) for a, b in zip(back["j"].unbind(), nested.unbind(), strict=True))
    two_dims = TensorDict({"a": torch.zeros(2, 3, 4)}, batch_size=[2, 3])
    assert deserialize_tensordict(serialize_tensordict(two_dims)).batch_size == (2, 3)


def test_malformed_input_names_what_is_wrong() -> None:
    with pytest.raises(ProtocolTypeError, match=r"expected a torch.Tensor, got list"):
        serialize_single_tensor([1, 2])  # type: ignore[arg-type]
    nested = torch.nested.as_nested_tensor([torch.zeros(1), torch.zeros(2)])
    with pytest.raises(ProtocolTypeError, match=r"only dense tensors"):
        serialize_single_tensor(nested)
    with pytest.raises(SerializationError, match=r"unknown dtype name 'float99'"):
        deserialize_single_tensor(("float99", (1,), np.zeros(4, dtype=np.uint8)))
    with pytest.raises(SerializationError, match=r"3 bytes for a float32 tensor of shape \[1\]"):
        deserialize_single_tensor(("float32", (1,), np.zeros(3, dtype=np.uint8)))
    with pytest.raises(SerializationError, match=r"expected \(dtype, shape, data\)"):
        deserialize_single_tensor("float32")
    inner = TensorDict({"a": torch.zeros(2)}, batch_size=[2])
    with pytest.raises(ProtocolTypeError, match=r"entry 'sub' is a TensorDict"):
        serialize_tensordict(TensorDict({"sub": inner}, batch_size=[2]))
    with pytest.raises(ProtocolTypeError, match=r"expected a TensorDict, got dict"):
        serialize_tensordict({"a": torch.zeros(1)})  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match=r"entry 'a' has unknown layout 'bent'"):
        deserialize_tensordict(((1,), None, {"a": ("bent", [])}))
    with pytest.raises(SerializationError, match=r"entry 'a' is not a tensor encoding"):
        deserialize_tensordict(((1,), None, {"a": 5}))
    with pytest.raises(SerializationError, match=r"items must be a dict, got list"):
        deserialize_tensordict(((1,), None, []))
