"""sc-protocol's tiers: the top level is what a user of DataProto writes; ``sc_protocol.ext``
holds what a backend or a dispatch mode needs beyond it. Each public module keeps the
contract of ``sc_dispatch._public``."""

from __future__ import annotations

import pickle

import sc_protocol
import torch
from sc_dispatch import _public

PUBLIC_MODULES = ["sc_protocol", "sc_protocol.ext"]


def test_these_are_the_public_modules() -> None:
    assert _public.public_modules("sc_protocol") == PUBLIC_MODULES


def test_each_public_module_keeps_the_contract() -> None:
    # __all__ sorted and defined; every exported class and function names the public module
    # that exports it as its __module__, pickles by reference and resolves its annotations
    assert _public.problems(PUBLIC_MODULES) == []


def test_a_pickled_dataproto_names_public_modules_and_round_trips() -> None:
    batch = sc_protocol.DataProto.from_dict({"x": torch.arange(4)}, meta_info={"step": 1})
    data = pickle.dumps(batch)
    assert b"sc_protocol._data_proto" not in data
    back = pickle.loads(data)
    assert type(back) is sc_protocol.DataProto
    assert back.batch is not None
    assert torch.equal(back.batch["x"], torch.arange(4))
    assert back.meta_info == {"step": 1}
