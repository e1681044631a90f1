"""The error of a tracker whose extra is not installed."""

from __future__ import annotations

from .._errors import MissingExtraError

__all__ = ["missing_extra"]


def missing_extra(tracker: str, package: str, extra: str, err: ImportError) -> MissingExtraError:
    """The :class:`MissingExtraError` for tracker ``tracker``, which could not import
    ``package`` (``err``): the message names the extra that installs it."""
    return MissingExtraError(
        f"the {tracker!r} tracker needs {package}, which cannot be imported ({err}); "
        f"install the extra: pip install 'sc-trainer[{extra}]'"
    )
