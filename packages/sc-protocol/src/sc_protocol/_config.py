"""Process-wide settings: the auto-padding switch and the read-only buffer policy."""

from __future__ import annotations

from ._errors import ProtocolTypeError
from ._settings import AUTO_PADDING, COPY_READONLY_BUFFERS

__all__ = ["DataProtoConfig"]


class _DataProtoConfigMeta(type):
    """Class-level properties, so that ``DataProtoConfig.auto_padding = True`` works as in verl."""

    _auto_padding: bool | None = None
    _copy_readonly_buffers: bool | None = None

    @property
    def auto_padding(cls) -> bool:
        """Global auto-padding switch: on when it was assigned ``True`` *or* the environment
        variable ``SC_PROTOCOL_AUTO_PADDING`` is true (verl's rule: the variable turns padding on
        for a whole job, whatever the program assigned)."""
        return bool(cls._auto_padding) or AUTO_PADDING.get()

    @auto_padding.setter
    def auto_padding(cls, enabled: bool | None) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise ProtocolTypeError(
                f"DataProtoConfig.auto_padding must be a bool (None resets it to False), "
                f"got {type(enabled).__name__} {enabled!r}"
            )
        cls._auto_padding = enabled

    @property
    def copy_readonly_buffers(cls) -> bool:
        """Whether unpickling copies tensors out of read-only buffers.

        Defaults to the environment variable ``SC_PROTOCOL_COPY_READONLY_BUFFERS`` (off): tensors
        then alias the read-only memory (for example Ray's object store), without a copy.
        """
        if cls._copy_readonly_buffers is not None:
            return cls._copy_readonly_buffers
        return COPY_READONLY_BUFFERS.get()

    @copy_readonly_buffers.setter
    def copy_readonly_buffers(cls, enabled: bool | None) -> None:
        if enabled is not None and not isinstance(enabled, bool):
            raise ProtocolTypeError(
                f"DataProtoConfig.copy_readonly_buffers must be a bool (or None to follow "
                f"SC_PROTOCOL_COPY_READONLY_BUFFERS), got {type(enabled).__name__} {enabled!r}"
            )
        cls._copy_readonly_buffers = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto settings (verl's ``DataProtoConfig``).

    * ``DataProtoConfig.auto_padding`` -- when true, every DataProto may be padded so that
      it splits evenly across workers. It is true when the program assigned ``True`` or the
      environment has ``SC_PROTOCOL_AUTO_PADDING=1`` (verl's ``VERL_AUTO_PADDING``): assigning
      ``False`` does not override the environment variable.
    * ``DataProtoConfig.auto_padding_key`` -- the ``meta_info`` key of the per-object flag
      (set by ``from_dict(..., auto_padding=True)``).
    * ``DataProtoConfig.copy_readonly_buffers`` -- see :mod:`sc_protocol` serialization.
    """

    auto_padding_key = "_sc_auto_padding"
