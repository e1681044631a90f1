"""Pipeline parallelism for the megatron-style engine: stages x FSDP2 x tensor parallelism.

A ``(pp, dp, tp)`` DeviceMesh; ``rank = (pp_rank * dp + dp_rank) * tp + tp_rank``. The
model is split by decoder layers (:func:`~sc_workers.models.split_layers`) into
``pp x vpp`` stages; pipeline rank ``r`` runs stages ``r, r + pp, r + 2 pp ...`` (one
without virtual pipelining). Each stage is a :class:`~sc_workers.models.ModelStage` that
keeps the whole model's parameter names: a :class:`~sc_workers.models.TinyStage` of the
built-in model, or a :class:`~sc_workers.models.HFStage` of a Hugging Face Llama, Mistral,
Qwen2 or Qwen3 decoder (actor or critic); tensor parallelism splits its layers over the
mesh's ``tp`` dimension and FSDP2 shards it over ``dp``, as in :class:`MegatronEngine`.

Micro-batches run through a ``torch.distributed.pipelining`` schedule (1F1B, GPipe or
interleaved 1F1B) built per call on the ``pp`` process group: :meth:`PipelineEngine.train_step`
(forward and backward, the loss computed on the last stage) and
:meth:`PipelineEngine.forward_only` (``eval``, no backward: log-probs and values). Only the
last stage has outputs; the first stage reads the model inputs and every stage after it
receives the hidden states with the attention mask and positions.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from sc_core import worker_environ
from torch import Tensor, nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.tensor import DTensor

from .._config import FSDPConfig, MegatronConfig, ModelConfig, OptimConfig
from .._errors import ConfigError, PipelineStageError, UnsupportedParallelismError
from .._settings import PIPELINE_TIMEOUT
from ..models import (
    HFCausalLM,
    HFModelKind,
    HFStageSplit,
    HFValueModel,
    KVCache,
    ModelStage,
    TinyCausalLM,
    TinyStage,
    split_layers,
)
from ..models._stage import graft
from ._fsdp import shard_module
from ._groups import FailureRecord, groups
from ._megatron import MegatronEngine
from ._modules import block_modules, param_dtype_for
from ._parallel import ParallelLayout
from ._pipeline_group import pipeline_group, root_cause, tear_down

if TYPE_CHECKING:
    from torch.distributed.pipelining.stage import _PipelineStageBase

__all__ = ["PipelineEngine", "PipelineModel"]

logger = logging.getLogger(__name__)

#: ``loss_fn(stage_output, index) -> scalar`` on the last stage (``index``: the
#: micro-batch's number, a 0-d tensor)
LossFn = Callable[[Any, Tensor], Tensor]

#: ``(layers, first, last) -> stage`` of one model
StageFactory = Callable[[range, bool, bool], ModelStage]


class PipelineModel(nn.Module):
    """The stages one pipeline rank runs, seen as one module with the whole model's names.

    It shares the stages' submodules (:meth:`~sc_workers.models.ModelStage.parts`:
    embeddings on the first stage, the layers, norm and head on the last) at their names
    in the unsplit model, so ``named_parameters()`` lists this rank's parameters under
    the names they have there (``layers.3.…`` of the built-in model,
    ``model.model.layers.3.…`` of a Hugging Face causal LM); the optimizer, checkpoints,
    weight sync and gradient clipping use it like any engine's module. It has no forward:
    micro-batches run through the engine's pipeline schedule.
    """

    def __init__(self, stages: Sequence[ModelStage]) -> None:
        super().__init__()
        for stage in stages:
            for name, part in stage.parts().items():
                graft(self, name, part)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise UnsupportedParallelismError(
            "PipelineModel: a pipelined model has no single forward; run micro-batches "
            "through PipelineEngine.train_step / forward_only"
        )


class PipelineEngine(MegatronEngine):
    """Pipeline stages x FSDP2 data parallelism x tensor parallelism.

    The built-in model, or a Hugging Face decoder loaded from ``model.path`` (see
    :class:`~sc_workers.models.HFStageSplit` for the architectures that split).
    ``megatron`` gives the number of virtual stages per rank and the schedule. Training
    and scoring go through :meth:`train_step` and :meth:`forward_only` (micro-batches in a
    schedule); :meth:`forward` runs the stages one after another for generation.
    """

    strategy = "megatron"

    def __init__(
        self,
        model_config: ModelConfig,
        fsdp_config: FSDPConfig,
        layout: ParallelLayout,
        device: torch.device,
        optim_config: OptimConfig | None = None,
        value_head: bool = False,
        megatron: MegatronConfig | None = None,
    ) -> None:
        super().__init__(model_config, fsdp_config, layout, device, optim_config, value_head)
        if megatron is None:
            megatron = MegatronConfig(
                tensor_model_parallel_size=layout.tp_size,
                pipeline_model_parallel_size=layout.pp_size,
            )
        self.megatron = megatron
        self.stages: list[ModelStage] = []
        self.stage_ids: list[int] = []
        self._hf_kind: HFModelKind | None = None
        self._p2p_group: dist.ProcessGroup | None = None
        self._failure = ""

    # ------------------------------------------------------------------ layout
    @property
    def num_stages(self) -> int:
        """Stages of the whole pipeline: ``pp x vpp``."""
        return self.layout.pp_size * self.megatron.virtual_stages

    @property
    def is_first_stage(self) -> bool:
        """Pipeline rank 0 runs stage 0 (with virtual stages too)."""
        return self.layout.is_first_stage

    @property
    def is_last_stage(self) -> bool:
        """Pipeline rank pp - 1 runs the last stage (with virtual stages too)."""
        return self.layout.is_last_stage

    # ------------------------------------------------------------------- build
    def _make_mesh(self) -> DeviceMesh:
        lay = self.layout
        if self.fsdp_config.fsdp_size not in (-1, lay.dp_size):
            raise ConfigError(
                f"fsdp_config.fsdp_size {self.fsdp_config.fsdp_size}: HSDP is not combined with "
                f"model parallelism; use -1 (shard over the dp size {lay.dp_size})"
            )
        return init_device_mesh(
            self.device.type,
            (lay.pp_size, lay.dp_size, lay.tp_size),
            mesh_dim_names=("pp", "dp", "tp"),
        )

    def _stage_factory(self, module: nn.Module, where: str) -> tuple[int, StageFactory]:
        """The number of decoder layers of ``module`` and how to build its stages."""
        if isinstance(module, TinyCausalLM):
            if module.lm_head.weight is module.embed_tokens.weight:
                raise UnsupportedParallelismError(
                    f"{where}: tie_word_embeddings puts one weight on the first and the last "
                    "stage; untie them (model.tie_word_embeddings=False) for pipeline "
                    "parallelism"
                )

            def tiny(layers: range, first: bool, last: bool) -> ModelStage:
                return TinyStage(module, layers, first, last)

            return len(module.layers), tiny
        if isinstance(module, (HFCausalLM, HFValueModel)):
            split = HFStageSplit(
                module, block_modules(module), f"{where}, model {self.model_config.path!r}"
            )
            self._hf_kind = "causal_lm" if isinstance(module, HFCausalLM) else "value_model"
            return split.num_layers, split.stage
        raise UnsupportedParallelismError(
            f"{where} splits the built-in model and Hugging Face decoders by decoder layers; "
            f"{type(module).__name__} (model {self.model_config.path!r}) cannot be split"
        )

    def _parallelize(self, module: nn.Module, mesh: DeviceMesh) -> nn.Module:
        where = f"rank {self.layout.rank}: pipeline_model_parallel_size {self.layout.pp_size}"
        num_layers, make_stage = self._stage_factory(module, where)
        self._p2p_group = pipeline_group(
            self.layout, timedelta(seconds=PIPELINE_TIMEOUT.get(worker_environ()))
        )
        ranges = split_layers(num_layers, self.num_stages)
        pp, last = self.layout.pp_size, self.num_stages - 1
        self.stage_ids = [self.layout.pp_rank + k * pp for k in range(self.megatron.virtual_stages)]
        self.stages = []
        for stage_id in self.stage_ids:
            stage = make_stage(ranges[stage_id], stage_id == 0, stage_id == last)
            self._tensor_parallel(stage, mesh)  # in place
            shard_module(self, stage, mesh["dp"])
            self.stages.append(stage)
        logger.info(
            "rank %d: pipeline stages %s of %d (layers %s)",
            self.layout.rank,
            self.stage_ids,
            self.num_stages,
            [list(ranges[i]) for i in self.stage_ids],
        )
        return PipelineModel(self.stages)

    @property
    def pp_group(self) -> dist.ProcessGroup:
        group = self._p2p_group
        if group is None:
            raise PipelineStageError(
                f"rank {self.layout.rank}: this pipeline was torn down after a stage failed "
                f"({self._failure}); a worker rebuilds its engines at its next call (an engine "
                "used directly must be built again)"
            )
        return group

    def _run_schedule(self, what: str, run: Callable[[], Any]) -> Any:
        """Run ``run()`` (a schedule step on this rank); if it raises, tear the pipeline
        group down, so that no peer stage stays blocked waiting for this one (their sends
        and receives fail at once and they tear down theirs), and raise
        :class:`PipelineStageError` naming this rank, its stages and the first error.

        The error carries the original's text and traceback, not the original itself: the
        original's frames and the schedule's pending sends and receives hold the group's
        connections open for as long as they live."""
        self.pp_group  # noqa: B018  # raises if an earlier failure tore the pipeline down
        failure: tuple[str, bool, str] | None = None
        try:
            return run()
        except Exception as exc:
            cause, peer = root_cause(exc)
            failure = (cause, peer, "".join(traceback.format_exception(exc)))
        # past the except clause: the original error and its frames are gone
        cause, peer, detail = failure
        stages = ", ".join(map(str, self.stage_ids))
        plural = "s" if len(self.stage_ids) > 1 else ""
        of = self.num_stages
        where = f"rank {self.layout.rank} (pipeline stage{plural} {stages} of {of})"
        self._failure = f"{where}: {what}: {cause}"
        if not peer:  # before the group closes: the peers read who failed once theirs fail
            groups().publish(FailureRecord(self.layout.rank, f"{where}: {what}", cause))
        self._release_pipeline_group()
        logger.error("%s; the pipeline group is torn down", self._failure)
        error = PipelineStageError(
            f"{where}: {what} failed: {cause}\n\nThe stage's error, as raised:\n{detail}"
        )
        # a peer's failure seen from here: the driver reports the peer's own error
        error.sc_caused_by_peer = peer
        raise error

    def _release_pipeline_group(self) -> None:
        """Drop and destroy the pipeline group. In a frame of its own, which ends before
        the error is raised: a raised error's traceback keeps its frames' locals alive."""
        group, self._p2p_group = self._p2p_group, None
        tear_down(group)

    # ----------------------------------------------------------------- compute
    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        position_ids: Tensor,
        cache: Any = None,
    ) -> Tensor:
        """Logits ``[b, s, vocab]`` of the whole model, on every rank (for generation).

        A collective over the pipeline group: the stages run one after another on the
        same tokens, each sending its hidden states to the next stage's rank, and the last
        stage broadcasts the logits, so every rank samples the same tokens (as the tensor
        parallel ranks of a stage do). No micro-batching: it serves token-by-token
        decoding with a :meth:`new_cache`, where a schedule has nothing to overlap.
        """
        ids, mask, pos = (t.to(self.device) for t in (input_ids, attention_mask, position_ids))
        group, me, pp = self.pp_group, self.layout.pp_rank, self.layout.pp_size
        dtype = param_dtype_for(self.fsdp_config.param_dtype, self.device)
        b, s = ids.shape
        hidden: Tensor | None = None
        out: Tensor | None = None
        for stage_id in range(self.num_stages):
            host = stage_id % pp
            if host == me:
                stage = self.stages[self.stage_ids.index(stage_id)]
                x = ids if stage_id == 0 else hidden
                result = stage(x, mask, pos) if cache is None else stage(x, mask, pos, cache=cache)
                if stage.is_last:
                    out = result
                    break
                hidden = result[0]
            if stage_id == self.num_stages - 1:
                break
            nxt = (stage_id + 1) % pp
            if host == nxt:
                continue
            if host == me:
                if hidden is None:  # pragma: no cover - set by the stage above
                    raise RuntimeError("no hidden states to send")
                dist.send(hidden.contiguous(), dist.get_global_rank(group, nxt), group=group)
            elif nxt == me:
                hidden = torch.empty(b, s, self.model_config.hidden_size, dtype=dtype)
                hidden = hidden.to(self.device)
                dist.recv(hidden, dist.get_global_rank(group, host), group=group)
        last_host = (self.num_stages - 1) % pp
        if out is None:
            shape = (b, s) if self.value_head else (b, s, self.model_config.vocab_size)
            out = torch.empty(shape, dtype=dtype, device=self.device)
        else:
            out = out.to(dtype).contiguous()
        dist.broadcast(out, dist.get_global_rank(group, last_host), group=group)
        return out

    @property
    def supports_kv_cache(self) -> bool:
        """The built-in model's stages decode with a key/value cache; a Hugging Face
        model's stages recompute the sequence at each step."""
        return all(isinstance(stage, TinyStage) for stage in self.stages)

    @property
    def hf_kind(self) -> HFModelKind | None:
        """The kind of the Hugging Face model split into these stages; None if built in."""
        _ = self.module  # raises NotInitializedError before build()
        return self._hf_kind

    def new_cache(self) -> KVCache | None:
        """An empty key/value cache of the whole model (this rank fills its layers); None
        for stages that decode without one."""
        if not self.supports_kv_cache:
            return None
        return KVCache(self.model_config.num_hidden_layers)

    def _schedule(self, n_micro: int, loss_fn: LossFn | None) -> Any:
        # imported here, not with the module: torch's pipelining imports dynamo and sympy,
        # about 2 s of every worker process that never builds a pipeline
        from torch.distributed.pipelining import (
            PipelineStage,
            Schedule1F1B,
            ScheduleGPipe,
            ScheduleInterleaved1F1B,
        )

        group = self.pp_group
        stages: list[_PipelineStageBase] = [
            PipelineStage(stage, stage_id, self.num_stages, self.device, group=group)
            for stage, stage_id in zip(self.stages, self.stage_ids, strict=True)
        ]
        name = self.megatron.schedule
        if name == "Interleaved1F1B":
            if n_micro % self.layout.pp_size:
                raise ConfigError(
                    f"rank {self.layout.rank}: the interleaved 1F1B schedule needs a number of "
                    f"micro-batches divisible by pipeline_model_parallel_size "
                    f"{self.layout.pp_size}, got {n_micro}"
                )
            return ScheduleInterleaved1F1B(stages, n_micro, loss_fn=loss_fn, scale_grads=False)
        cls = ScheduleGPipe if name == "GPipe" else Schedule1F1B
        return cls(stages[0], n_micro, loss_fn=loss_fn, scale_grads=False)

    def _micro_args(
        self, inputs: Sequence[tuple[Tensor, Tensor, Tensor]]
    ) -> list[tuple[Tensor, ...]] | None:
        if not self.is_first_stage:
            return None
        # contiguous: the masks travel to the next stage with the activations, through gloo
        return [tuple(t.to(self.device).contiguous() for t in micro) for micro in inputs]

    def train_step(
        self,
        inputs: Sequence[tuple[Tensor, Tensor, Tensor]],
        heads: Sequence[Any],
        loss_fn: LossFn,
    ) -> None:
        """Forward and backward of ``len(heads)`` micro-batches through the pipeline.

        ``inputs`` (first stage only; ignored elsewhere): each micro-batch's ``(input_ids,
        attention_mask, position_ids)``. On the last stage ``heads[i]`` maps the logits
        (values) to what ``loss_fn(output, i)`` takes (``i`` as a 0-d tensor: the schedule
        passes targets as tensors); the loss's gradients accumulate into the parameters
        (no optimizer step). Every rank of the pipeline group calls it with the same
        number of micro-batches.
        """
        kwargs = [{"head": head} for head in heads]
        target_mbs = [torch.tensor(i) for i in range(len(heads))] if self.is_last_stage else None
        args = self._micro_args(inputs)
        # the schedule (and its stages, which hold the pipeline group) lives in the frame
        # of the lambda only, so a teardown after a failure can drop every reference
        self._run_schedule(
            "train_step",
            lambda: self._schedule(len(heads), loss_fn).step(
                arg_mbs=args, kwarg_mbs=kwargs, target_mbs=target_mbs, return_outputs=False
            ),
        )

    def forward_only(
        self, inputs: Sequence[tuple[Tensor, Tensor, Tensor]], heads: Sequence[Any]
    ) -> Any:
        """Forward of ``len(heads)`` micro-batches, no backward; the last stage returns the
        heads' outputs merged along the batch dimension, other stages ``None``."""
        kwargs = [{"head": head} for head in heads]
        args = self._micro_args(inputs)
        with torch.no_grad():
            return self._run_schedule(
                "forward_only",
                lambda: self._schedule(len(heads), None).eval(arg_mbs=args, kwarg_mbs=kwargs),
            )

    # ------------------------------------------------------------- checkpoint
    def full_state_dict(self) -> dict[str, Tensor]:
        """Every parameter as a full CPU tensor on rank 0 (empty elsewhere): each stage
        gathers its own (a collective over its dp x tp ranks), and the stages' first
        ranks send theirs to rank 0."""
        local: dict[str, Tensor] = {}
        for name, param in self.module.named_parameters():
            full = param.full_tensor() if isinstance(param, DTensor) else param
            local[name] = full.detach().to("cpu", copy=True)
        if self.layout.dp_rank != 0 or self.layout.tp_rank != 0:
            return {}
        gathered: list[Any] = [None] * self.layout.pp_size if self.layout.rank == 0 else []
        dist.gather_object(
            local, gathered if self.layout.rank == 0 else None, dst=0, group=self.pp_group
        )
        if self.layout.rank != 0:
            return {}
        out: dict[str, Tensor] = {}
        for part in gathered:
            out.update(part)
        return out
