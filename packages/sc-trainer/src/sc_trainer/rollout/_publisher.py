"""``WeightPublisher``: the trainer's weights written for the rollout servers, and pushed.

:meth:`WeightPublisher.publish` writes version ``v`` to ``<run_dir>/weights/v<v>/`` (a
directory holding ``model.safetensors``, or the files of a checkpoint directory it is given)
atomically: everything is written into a temporary directory next to it, each file and the
directory fsynced, and the directory renamed into place, so that ``v<v>`` either does not
exist or is complete. It then pushes ``WeightUpdate(v, path=<that directory>)`` through the
router (every server loads it; requests in flight continue on the new weights from their next
token, nothing waits for them) and keeps the last ``keep`` versions on disk.

The path given to the engines is the directory: vLLM reloads from a directory of safetensors
files, the built-in torch engine and the toy engine take a directory too. On a multi-node
cluster ``run_dir`` must be on storage that every server's node sees.

Versions count actor updates (the weights of actor version ``v`` are published as ``v``), so
a trajectory's weight versions compare directly to the actor's (staleness, see
:class:`~sc_trainer.rollout.PartialRollout`).
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import threading
import uuid
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import save_file
from sc_rollout import Router, WeightUpdate

from .._errors import RolloutInputError, WeightPublishError, int_at_least

__all__ = ["WEIGHTS_FILE", "WeightPublisher"]

logger = logging.getLogger(__name__)

#: the file a mapping of tensors is written to, in its version's directory
WEIGHTS_FILE = "model.safetensors"

_VERSION_DIR = re.compile(r"^v(\d+)$")


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _cpu_tensors(weights: Mapping[str, torch.Tensor], version: int) -> dict[str, torch.Tensor]:
    """Contiguous CPU tensors, one storage each (safetensors refuses shared storage: tied
    embeddings are written as two tensors)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, tensor in weights.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise RolloutInputError(
                f"WeightPublisher.publish(version={version}): weights must map str names to "
                f"tensors, got {name!r}: {type(tensor).__name__}"
            )
        value = tensor.detach().to("cpu").contiguous()
        pointer = value.untyped_storage().data_ptr()
        if pointer in seen and value.numel():
            value = value.clone()
        seen.add(value.untyped_storage().data_ptr())
        out[name] = value
    if not out:
        raise RolloutInputError(f"WeightPublisher.publish(version={version}): no tensors")
    return out


class WeightPublisher:
    """Writes each weight version under ``<run_dir>/weights`` and pushes it through
    ``router`` (see the module's documentation). ``keep`` (>= 1): versions kept on disk.

    Thread-safe: one publish at a time. A version not above the last one published is a
    :class:`RolloutInputError`; a write that fails a :class:`WeightPublishError` (nothing
    is pushed, no partial directory is left).
    """

    def __init__(self, run_dir: str | os.PathLike[str], router: Router, *, keep: int = 2) -> None:
        int_at_least(keep, 1, "WeightPublisher: keep", RolloutInputError)
        self.weights_dir = Path(run_dir) / "weights"
        self._router = router
        self._keep = keep
        self._lock = threading.Lock()
        self._last: int | None = None

    @property
    def version(self) -> int | None:
        """The last version published by this publisher (``None``: none yet)."""
        return self._last

    def path_of(self, version: int) -> Path:
        """The directory of weight version ``version``."""
        return self.weights_dir / f"v{version}"

    def versions_on_disk(self) -> list[int]:
        """The complete versions in the weight directory, oldest first."""
        if not self.weights_dir.is_dir():
            return []
        found = (_VERSION_DIR.match(p.name) for p in self.weights_dir.iterdir() if p.is_dir())
        return sorted(int(m.group(1)) for m in found if m is not None)

    def publish(
        self,
        version: int,
        weights: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    ) -> Path:
        """Write ``weights`` (a mapping of tensors, a ``.safetensors`` file, or a directory
        of them) as ``version`` and push it to every server; returns its directory. Does not
        wait for requests in flight."""
        with self._lock:
            path = self._write(version, weights)
            self._router.push_weights(WeightUpdate(version, path=str(path)))
            self._last = version
            self._prune()
        logger.info("weights version %d published at %s", version, path)
        return path

    def write(
        self,
        version: int,
        weights: Mapping[str, torch.Tensor] | str | os.PathLike[str],
    ) -> Path:
        """Only write ``version`` (atomically, as :meth:`publish` does), without pushing it."""
        with self._lock:
            return self._write(version, weights)

    def _write(
        self, version: int, weights: Mapping[str, torch.Tensor] | str | os.PathLike[str]
    ) -> Path:
        int_at_least(version, 0, "WeightPublisher.publish: version", RolloutInputError)
        if self._last is not None and version <= self._last:
            raise RolloutInputError(
                f"WeightPublisher.publish(version={version}): not above the last version "
                f"published, {self._last}"
            )
        source = Path(weights) if isinstance(weights, (str, os.PathLike)) else None
        tensors = None if isinstance(weights, (str, os.PathLike)) else weights
        if tensors is not None and not isinstance(tensors, Mapping):
            raise RolloutInputError(
                f"WeightPublisher.publish(version={version}): weights must be a mapping of "
                f"tensors or a path, got {type(weights).__name__}"
            )
        final = self.path_of(version)
        tmp = self.weights_dir / f".v{version}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            self.weights_dir.mkdir(parents=True, exist_ok=True)
            tmp.mkdir()
            if source is not None:
                self._copy_in(source, tmp, version)
            elif tensors is not None:
                save_file(_cpu_tensors(tensors, version), str(tmp / WEIGHTS_FILE))
            for item in tmp.rglob("*"):
                if item.is_file():
                    _fsync(item)
            _fsync(tmp)
            if final.exists():  # left by an earlier run: replaced
                stale = self.weights_dir / f".v{version}.old-{uuid.uuid4().hex[:8]}"
                final.rename(stale)
                shutil.rmtree(stale, ignore_errors=True)
            tmp.rename(final)
            _fsync(self.weights_dir)
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise WeightPublishError(
                f"WeightPublisher: writing weights version {version} to {final} failed: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        return final

    def _copy_in(self, source: Path, tmp: Path, version: int) -> None:
        if source.is_dir():
            shutil.copytree(source, tmp, dirs_exist_ok=True)
        elif source.is_file():
            name = source.name if source.suffix == ".safetensors" else WEIGHTS_FILE
            shutil.copy2(source, tmp / name)
        else:
            raise RolloutInputError(
                f"WeightPublisher.publish(version={version}): {str(source)!r} is neither a "
                "weight file nor a directory"
            )

    def _prune(self) -> None:
        """Remove all but the newest ``keep`` versions, and temporary directories left by a
        publish that died."""
        versions = self.versions_on_disk()
        for old in versions[: -self._keep]:
            shutil.rmtree(self.path_of(old), ignore_errors=True)
            logger.debug("weights version %d pruned", old)
        for item in self.weights_dir.iterdir():
            if item.name.startswith(".v") and (".tmp-" in item.name or ".old-" in item.name):
                shutil.rmtree(item, ignore_errors=True)
