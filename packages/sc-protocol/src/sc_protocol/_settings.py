"""Every environment variable sc-protocol reads, declared once (see ``sc_dispatch._setting``)."""

from __future__ import annotations

from sc_dispatch._setting import Setting, parse_bool

__all__ = ["AUTO_PADDING", "COPY_READONLY_BUFFERS", "EAGER_DYNAMO", "SETTINGS"]

AUTO_PADDING: Setting[bool] = Setting(
    "SC_PROTOCOL_AUTO_PADDING",
    parse_bool,
    False,
    "pad every DataProto so that it splits evenly across workers; on whatever the program "
    "assigned to DataProtoConfig.auto_padding (verl's VERL_AUTO_PADDING)",
)
COPY_READONLY_BUFFERS: Setting[bool] = Setting(
    "SC_PROTOCOL_COPY_READONLY_BUFFERS",
    parse_bool,
    False,
    "unpickling copies tensors out of read-only buffers (Ray's object store) instead of "
    "aliasing them; DataProtoConfig.copy_readonly_buffers overrides it",
)

EAGER_DYNAMO: Setting[bool] = Setting(
    "SC_PROTOCOL_EAGER_DYNAMO",
    parse_bool,
    False,
    "import tensordict as it is, torch._dynamo included (by default sc_protocol defers "
    "tensordict's torch.compile marks until something imports torch._dynamo: a worker "
    "process starts about twice as fast)",
)

SETTINGS: tuple[Setting[object], ...] = (AUTO_PADDING, COPY_READONLY_BUFFERS, EAGER_DYNAMO)
