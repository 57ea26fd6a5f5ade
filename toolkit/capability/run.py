"""What the runner trains: each rule a field, the refused case in words, a condition over arrays and its reason."""

from __future__ import annotations

from ..specs.rules import interleaved_rounds_fit, named_backend_fits
from ..specs.stages import uneven_fits
from .rule import (
    Rule,
    _accum,
    _arr,
    _backend_is,
    _empty_chunk,
    _experts,
    _experts_folded,
    _piped,
    _replicas,
    _split,
    _tp_or_pp,
)

__all__ = ["RUN"]


def _folded_runs(job):
    """What the runner's folded experts take: ep over tp × dp ranks, etp 1, one stage, replicas averaged by hand,
    whole sequences per tp rank (arrays allowed)."""
    par = job.parallel
    tp = _arr(par.tp)
    return (
        (_arr(par.etp) == 1)
        & (_arr(par.pp) == 1)
        & (_arr(par.zero) == 0)
        & ~_arr(par.sp)
        & (_arr(par.cp) == 1)
        & (_arr(job.batch.micro_batch) % tp == 0)
    )


RUN = (
    Rule(
        "run",
        "parallel.tp",
        "mixed-* with tp or pp (Megatron's program)",
        lambda j: _backend_is(j, "megatron"),
        lambda j: (
            f"{j.precision.mode} with tensor or pipeline parallelism is Megatron's program (estimated only); "
            "use fp32, amp-* or pure-bf16 (torch's DTensor plan and pipeline schedules)"
        ),
        value=lambda j: j.parallel.tp if j.parallel.tp > 1 else j.parallel.pp,
        name_field=_tp_or_pp,
    ),
    Rule(
        "run",
        "parallel.tp",
        "DeepSpeed with tp or pp (Megatron-DeepSpeed)",
        lambda j: _backend_is(j, "deepspeed") & ((_arr(j.parallel.tp) > 1) | _piped(j)),
        "DeepSpeed's engine around Megatron's tensor parallelism and DeepSpeed's pipeline (Megatron-DeepSpeed) "
        "is estimated, not run; use fp32, amp-* or pure-bf16 (torch's DTensor plan and pipeline schedules)",
        value=lambda j: j.parallel.tp if j.parallel.tp > 1 else j.parallel.pp,
        name_field=_tp_or_pp,
    ),
    Rule(
        "run",
        "parallel.offload",
        "DeepSpeed with offload params (ZeRO-Infinity)",
        lambda j: _backend_is(j, "deepspeed") & (_arr(j.parallel.offload) == "params"),
        "DeepSpeed's parameter offload (ZeRO-Infinity) is estimated, not run; use offload optimizer (ZeRO-Offload), "
        "or amp-bf16 with FSDP2's offload params",
    ),
    Rule(
        "run",
        "parallel.backend",
        "a named backend whose program is not this layout's",
        lambda j: (
            ~named_backend_fits(j.parallel.backend, j.precision.mode, j.parallel.zero, j.parallel.tp, j.parallel.pp)
        ),
        "the named backend does not run this layout; leave backend unset",
    ),
    Rule(
        "run",
        "parallel.cp",
        "context parallelism (cp > 1)",
        lambda j: _arr(j.parallel.cp) > 1,
        "context parallelism is estimated, not run: torch's ring attention needs CUDA's attention kernels; use cp 1",
    ),
    Rule(
        "run",
        "parallel.zero",
        "torch's ZeRO-1 with tp",
        lambda j: (_arr(j.parallel.tp) > 1) & (_arr(j.parallel.zero) == 1),
        "torch's ZeRO-1 (ZeroRedundancyOptimizer) does not take tensor-parallel parameters; use zero 2 or 3 with tp",
        value=lambda j: 1,
    ),
    Rule(
        "run",
        "parallel.zero",
        "torch's ZeRO-1 with ep",
        lambda j: (_arr(j.parallel.ep) > 1) & (_arr(j.parallel.zero) == 1),
        "torch's ZeRO-1 (ZeroRedundancyOptimizer) broadcasts each parameter from one rank, but expert-parallel "
        "ranks hold different experts; use zero 0, 2 or 3 with ep",
        value=lambda j: 1,
    ),
    Rule(
        "run",
        "parallel.ep",
        "the experts' own grid beyond ep over tp × dp (etp, pipelines, ZeRO, sp, or uneven sequences)",
        lambda j: _experts_folded(j) & ~_folded_runs(j),
        "the runner folds ep over tensor-parallel ranks (Megatron-Core's folding) with etp 1, pp 1, zero 0, no sp "
        "and a micro-batch each tp rank can share by sequences; the rest of the expert grid is estimated, not run",
    ),
    Rule(
        "run",
        "parallel.ep",
        "expert parallelism with HSDP",
        lambda j: (_arr(j.parallel.ep) > 1) & (_arr(j.parallel.dp_replicate) > 1),
        "expert parallelism beside HSDP is estimated, not run; train ep with dp_replicate 1",
    ),
    Rule(
        "run",
        "precision.mode",
        "a Mixture of Experts in mixed-* (Megatron's or DeepSpeed's program)",
        lambda j: _experts(j) & (j.precision.plan.family == "mixed"),
        "a Mixture of Experts is trained by torch's program: use fp32, amp-* or pure-bf16 (mixed-* MoE training "
        "is estimated only)",
    ),
    Rule(
        "run",
        "model.capacity_factor",
        "a capacity factor (token dropping)",
        lambda j: _experts(j) & (j.model.capacity_factor is not None),
        "the runner routes dropless (every token reaches its experts); a capacity factor is estimated, not run: "
        "set it to null",
    ),
    Rule(
        "run",
        "model.attention_kind",
        "latent attention (MLA)",
        lambda j: j.model.attention_kind == "mla",
        "latent attention (DeepSeek's MLA) is counted, not run; the runner's attention is multi-head or grouped-query",
    ),
    Rule(
        "run",
        "model.experts",
        "a Mixture of Experts with adapters, int8 activations or pruning",
        lambda j: (
            _experts(j)
            & (bool(j.finetune.adapters) | (j.memory.act_compress != "none") | (j.training.pruning.method != "none"))
        ),
        "adapters, int8 saved activations and pruning are trained on dense models; train the MoE without them",
    ),
    Rule(
        "run",
        "parallel.offload",
        "offload params below ZeRO-2",
        lambda j: (_arr(j.parallel.offload) == "params") & (_arr(j.parallel.zero) < 2),
        "FSDP2 offloads sharded states: needs zero 2 or 3",
        value=lambda j: "params",
    ),
    Rule(
        "run",
        "parallel.dp_replicate",
        "HSDP with tp or pp",
        lambda j: (_arr(j.parallel.dp_replicate) > 1) & ((_arr(j.parallel.tp) > 1) | _piped(j)),
        "HSDP beside tensor or pipeline parallelism is estimated, not run; train HSDP with tp 1 and pp 1",
    ),
    Rule(
        "run",
        "parallel.offload",
        "a pipeline with offload optimizer",
        lambda j: _piped(j) & (_arr(j.parallel.offload) == "optimizer"),
        "pipelines offload FSDP2's shards (offload params, zero 2 or 3); DeepSpeed's optimizer offload under "
        "pipelines is estimated, not run",
    ),
    Rule(
        "run",
        "parallel.pp",
        "stages the layers do not fill",
        lambda j: _piped(j) & ~uneven_fits(j.model.layers, j.parallel.pp, j.parallel.vpp),
        "the layers do not fill pp × vpp stages; lower pp or vpp",
    ),
    Rule(
        "run",
        "parallel.pp",
        "a pipeline chunk holding no layer (the embedding or the loss alone)",
        lambda j: _piped(j) & _empty_chunk(j),
        "Megatron's layouts that leave a chunk the embedding or the loss alone are estimated, not run; lower pp or "
        "vpp, or list chunks of at least one layer in parallel.stage_layers",
    ),
    Rule(
        "run",
        "parallel.schedule",
        "interleaved stages with GPipe",
        lambda j: _piped(j) & (_arr(j.parallel.vpp) > 1) & (_arr(j.parallel.schedule) == "gpipe"),
        "interleaved stages (vpp > 1) run the interleaved 1F1B schedule; set schedule: 1f1b or vpp: 1",
        value=lambda j: "gpipe",
    ),
    Rule(
        "run",
        "batch.global_batch",
        "fewer micro-batches than stages",
        lambda j: _piped(j) & (_arr(j.parallel.vpp) == 1) & (_accum(j) < _arr(j.parallel.pp)),
        lambda j: (
            f"{j.grad_accum or 1} micro-batches per step for {j.parallel.pp} stages: torch's schedules need "
            "at least one per stage (raise global_batch or lower micro_batch)"
        ),
    ),
    Rule(
        "run",
        "batch.global_batch",
        "interleaved micro-batches not in whole rounds of pp",
        lambda j: _piped(j) & (_arr(j.parallel.vpp) > 1) & ~interleaved_rounds_fit(_accum(j), j.parallel.pp),
        lambda j: (
            f"interleaved 1F1B runs the {j.grad_accum or 1} micro-batches in rounds of {j.parallel.pp}: make "
            "their number a multiple of pp"
        ),
    ),
    Rule(
        "run",
        "precision.grad_dtype",
        "fp32 main gradients beyond replicas",
        lambda j: (j.precision.grad_dtype == "fp32") & ~_replicas(j),
        "fp32 main gradients are trained with replicas (zero 0, tp 1, pp 1); use param",
        value=lambda j: "fp32",
    ),
    Rule(
        "run",
        "finetune.method",
        "adapters beyond replicas",
        lambda j: bool(j.finetune.adapters) & ~_replicas(j),
        "adapters are trained with replicas (zero 0, tp 1, pp 1)",
    ),
    Rule(
        "run",
        "optimizer.name",
        "8-bit AdamW beyond replicas",
        lambda j: (j.optimizer.name == "adamw-8bit") & ~_replicas(j),
        "bitsandbytes' 8-bit AdamW is trained with replicas (zero 0, tp 1, pp 1)",
    ),
    Rule(
        "run",
        "memory.act_compress",
        "int8 activations on split weights",
        lambda j: (j.memory.act_compress == "int8") & _split(j),
        "int8 saved activations are trained with replicas or torch's ZeRO-1",
    ),
    Rule(
        "run",
        "memory.act_compress",
        "int8 activations with full recompute",
        lambda j: (j.memory.act_compress == "int8") & (_arr(j.memory.recompute) == "full"),
        "full recompute keeps only block inputs, which the runner does not compress: choose int8 or full recompute",
    ),
    Rule(
        "run",
        "training.pruning.method",
        "pruning on split weights",
        lambda j: (j.training.pruning.method != "none") & _split(j),
        "pruning masks whole matrices: train it with replicas or torch's ZeRO-1",
    ),
    Rule(
        "run",
        "training.fp32_norm",
        "FP32 norms in sharded, tensor-parallel, pipeline or DeepSpeed units",
        lambda j: bool(j.training.fp32_norm) & _split(j) & (j.precision.mode != "fp32"),
        "FP32 norms inside FSDP2, tensor-parallel, pipeline or DeepSpeed units are not trained yet; use replicas or "
        "torch's ZeRO-1",
        value=lambda j: True,
    ),
    Rule(
        "run",
        "precision.mode",
        "amp-fp16 on split weights",
        lambda j: (j.precision.mode == "amp-fp16") & _split(j),
        "fp16 loss scaling over sharded gradients or pipeline schedules is not trained yet; use amp-bf16",
    ),
    Rule(
        "run",
        "training.compile",
        "torch.compile with tensor parallelism, pipelines, DeepSpeed or a Mixture of Experts",
        lambda j: (
            bool(j.training.compile)
            & ((_arr(j.parallel.tp) > 1) | _piped(j) | _backend_is(j, "deepspeed") | _experts(j))
        ),
        "compiled blocks are trained on replicas and FSDP2 (ZeRO-1/2/3, one process); drop --compile for tensor "
        "parallelism, pipelines, DeepSpeed or a Mixture of Experts",
        value=lambda j: True,
    ),
    Rule(
        "run",
        "precision.fp8",
        "FP8 matmuls",
        lambda j: bool(j.precision.fp8),
        "FP8 matmuls (and FSDP2's float8 all-gather) are estimated, not run: the runner's matmuls are the mode's "
        "dtype; drop fp8",
    ),
    Rule(
        "run",
        "model",
        "a model without a decoder's shape",
        lambda j: not j.model.has_shape or bool(j.model.encoder),
        "the runner trains decoder models with layers, hidden and heads",
    ),
)
