"""A checkpoint of a run as a Hugging Face folder (``sc-export``, and ``save_hf`` on save).

:func:`export_checkpoint` takes a checkpoint folder (``checkpoints/global_step_N``), a
``checkpoints`` folder or a run's output folder (their newest complete checkpoint), and
writes its actor as a directory that ``transformers.AutoModelForCausalLM.from_pretrained``
loads: the weights reassembled from every rank's blocks (sc-workers'
``export_hf_checkpoint``, no process group needed), the model's config and tokenizer.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from sc_workers import export_hf_checkpoint

from ._output import resolve_checkpoint

__all__ = ["HF_FOLDER", "export_checkpoint"]

logger = logging.getLogger(__name__)

#: the folder of a checkpoint a run with ``save_hf`` writes the actor to
HF_FOLDER = "huggingface"


def export_checkpoint(path: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write the actor of the checkpoint ``path`` names as a Hugging Face folder ``out``;
    returns ``out``. :class:`~sc_trainer.runs.CheckpointNotFoundError` when ``path`` holds
    no complete checkpoint; sc-workers' ``CheckpointError`` for a checkpoint of the built-in
    model (it has no Hugging Face form)."""
    folder = resolve_checkpoint(path)
    target = Path(out)
    export_hf_checkpoint(folder / "actor", target)
    logger.info("exported the actor of %s to %s", folder, target)
    return target
