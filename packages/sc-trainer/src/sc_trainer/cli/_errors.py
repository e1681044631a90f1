"""The errors the commands report in one line, rather than with a traceback."""

from __future__ import annotations

from sc_rollout import ScRolloutError
from sc_workers import ScWorkersError

from .._errors import ScTrainerError

__all__ = ["user_errors"]


def user_errors() -> tuple[type[Exception], ...]:
    """sc-trainer's, sc-workers', sc-rollout's and sc-ray's errors: a bad option, data or
    reward, a run that cannot start or re-attach, a checkpoint that cannot be read. sc-ray's
    are imported here, once an error came: importing sc_ray imports Ray, which must not happen
    before the launcher switched off Ray's ``uv run`` runtime-env hook
    (``RAY_ENABLE_UV_RUN_RUNTIME_ENV``, read at import)."""
    from sc_ray import ScRayError

    return (ScTrainerError, ScWorkersError, ScRolloutError, ScRayError)
