"""A worker extension vLLM mixes into its workers (``worker_extension_cls``): the weight
reload the vLLM engine calls through ``collective_rpc``.

vLLM's in-place ``reload_weights`` loads every layer the checkpoint names and processes it
for its kernels. A layer that shares its weight with another (an output head tied to the
input embedding) is named in no checkpoint, so it keeps what its kernels derived from the
old weight: on the CPU build, a repacked copy for its matrix products (measured: after an
update, GPT-2's logits came from the old tied head). :func:`reprocess_shared_weights`
processes such layers again after each reload. Runs in vLLM's worker process; duck-typed,
so this module imports nothing from vLLM.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ScWorkerExtension", "reprocess_shared_weights"]


def reprocess_shared_weights(model: Any) -> int:
    """Run ``process_weights_after_loading`` again on every layer whose ``weight`` shares
    its storage with another layer's; returns how many layers were processed."""
    owners: dict[int, list[Any]] = {}
    for module in model.modules():
        weight = module._parameters.get("weight")
        if weight is not None and hasattr(module, "quant_method"):
            owners.setdefault(weight.data_ptr(), []).append(module)
    count = 0
    for modules in owners.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)
                count += 1
    return count


class ScWorkerExtension:
    """Mixed into vLLM's worker class: ``self`` is the worker."""

    def sc_reload_weights(self, weights_path: str) -> int:
        """Reload every weight from the safetensors files in ``weights_path``, then process
        the layers with shared weights again; returns how many those were."""
        worker: Any = self
        worker.reload_weights(weights_path=weights_path, is_checkpoint_format=True)
        return reprocess_shared_weights(worker.model_runner.get_model())
