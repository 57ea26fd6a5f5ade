"""What each tracer measures (on fake tensors, pipeline stages on gloo ranks, DeepSpeed on gloo ranks): its rules,
in the same form as the runner's."""

from __future__ import annotations

from ..specs.precision import TORCH_SEMANTICS
from .rule import Rule, _arr, _bf16_optimizer, _empty_chunk, _experts_folded, _piped, _torch_zero

__all__ = ["TRACE"]

TRACE = (
    Rule(
        "trace",
        "precision.fp8_all_gather",
        "FSDP2's float8 all-gather",
        lambda j: bool(j.precision.fp8_all_gather),
        "float8 needs CUDA's FP8 matmuls: estimated, not traced; trace without it (the gathered blocks in bf16)",
        value=lambda j: True,
    ),
    Rule(
        "trace",
        "parallel.pp",
        "a pipeline chunk holding no layer (the embedding or the loss alone)",
        lambda j: _piped(j) & _empty_chunk(j),
        "the pipeline tracer runs the runner's stages, each of at least one layer: Megatron's layouts that leave a "
        "chunk the embedding or the loss alone are estimated, not traced; lower pp or vpp",
    ),
    Rule(
        "trace",
        "parallel.ep",
        "the experts' own grid (ep over tensor-parallel ranks, or etp)",
        _experts_folded,
        "the tracer runs the runner's program, whose experts sit inside dp: a folded expert grid is estimated, not "
        "traced yet; trace ep dividing dp with etp 1",
    ),
    Rule(
        "trace",
        "model",
        "a model without a decoder's shape",
        lambda j: not j.model.has_shape or bool(j.model.encoder),
        "the tracer builds the runner's decoder: give a shape, not params only",
    ),
    Rule(
        "trace:fake",
        "parallel",
        "offload other than FSDP2's, DeepSpeed-style ZeRO, or tp with ZeRO-1",
        lambda j: (
            (
                (_arr(j.parallel.offload) != "none")
                & ~(
                    (_arr(j.parallel.offload) == "params")
                    & _torch_zero(j)
                    & (_arr(j.parallel.zero) >= 2)
                    & (_arr(j.parallel.tp) == 1)
                )
            )
            | ((_arr(j.parallel.zero) > 0) & ~_torch_zero(j))
            | ((_arr(j.parallel.tp) > 1) & (_arr(j.parallel.zero) == 1))
        ),
        "the tracer covers data-parallel replicas, torch's ZeRO (ZeroRedundancyOptimizer, FSDP2 with or without CPU "
        "offload; with fp32, amp-* or pure-bf16), DeepSpeed's ZeRO (mixed-bf16, with or without ZeRO-Offload), "
        "tensor parallelism alone or inside FSDP2 (zero 2/3), and pipelines alone so far; toolkit estimate models "
        "the other layouts analytically",
        value=lambda j: f"tp={j.parallel.tp} pp={j.parallel.pp} zero={j.parallel.zero} offload={j.parallel.offload}",
    ),
    Rule(
        "trace:fake",
        "precision.mode",
        "mixed-* with tp",
        lambda j: (_arr(j.parallel.tp) > 1) & (j.precision.mode not in TORCH_SEMANTICS),
        "mixed-* modes follow Megatron's tensor-parallel program, which the tracer does not run; trace tp with "
        "fp32, amp-* or pure-bf16 (torch's DTensor plan)",
    ),
    Rule(
        "trace:fake",
        "parallel.tp",
        "tp with tied embeddings, or sp with learned positions",
        lambda j: (
            (_arr(j.parallel.tp) > 1)
            & (bool(j.model.tie_embeddings) | (_arr(j.parallel.sp) & (j.model.position == "learned")))
        ),
        "the traced tensor-parallel plan needs untied embeddings, and rotary positions with sequence parallelism",
    ),
    Rule(
        "trace:fake",
        "precision.grad_dtype",
        "fp32 main gradients with ZeRO, tp or adapters",
        lambda j: (
            (j.precision.grad_dtype == "fp32")
            & ((_arr(j.parallel.zero) > 0) | (_arr(j.parallel.tp) > 1) | bool(j.finetune.adapters))
        ),
        "fp32 main gradients are traced with replicas (zero 0, tp 1) and full fine-tuning so far; use param",
        value=lambda j: "fp32",
    ),
    Rule(
        "trace:fake",
        "optimizer.name",
        "8-bit AdamW with ZeRO, tp or QLoRA",
        lambda j: (
            (j.optimizer.name == "adamw-8bit")
            & ((_arr(j.parallel.zero) > 0) | (_arr(j.parallel.tp) > 1) | (j.finetune.method == "qlora"))
        ),
        "8-bit optimizers are traced with replicas (zero 0, tp 1), full fine-tuning or LoRA, so far",
    ),
    Rule(
        "trace:fake",
        "memory.act_compress",
        "int8 activations with ZeRO-2/3, full recompute, adapters or tp",
        lambda j: (
            (j.memory.act_compress != "none")
            & (
                (_arr(j.parallel.zero) >= 2)
                | (_arr(j.memory.recompute) == "full")
                | bool(j.finetune.adapters)
                | (_arr(j.parallel.tp) > 1)
            )
        ),
        "int8 activations are traced with replicas (tp 1, zero 0/1), recompute none or selective, full fine-tuning",
    ),
    Rule(
        "trace:pipeline",
        "parallel.offload",
        "a pipeline with offload other than FSDP2's",
        lambda j: (
            (_arr(j.parallel.offload) != "none")
            & ((_arr(j.parallel.zero) < 2) | (j.precision.mode not in TORCH_SEMANTICS))
        ),
        "pipelines are traced with FSDP2's offload (zero 2 or 3, --offload params) only",
    ),
    Rule(
        "trace:pipeline",
        "parallel.schedule",
        "interleaved stages with GPipe",
        lambda j: (_arr(j.parallel.vpp) > 1) & (_arr(j.parallel.schedule) == "gpipe"),
        "interleaved stages (vpp > 1) run the interleaved 1F1B schedule; set schedule: 1f1b or vpp: 1",
    ),
    Rule(
        "trace:pipeline",
        "precision.mode",
        "a pipeline in a mixed-* mode",
        lambda j: j.precision.mode not in TORCH_SEMANTICS,
        "mixed-* modes follow Megatron's pipeline program, which the tracer does not run; trace pipelines with "
        "fp32, amp-* or pure-bf16 (torch's schedules)",
    ),
    Rule(
        "trace:pipeline",
        "finetune.method",
        "a pipeline with adapters, int8 activations or 8-bit AdamW",
        lambda j: (
            (j.finetune.method != "full") | (j.memory.act_compress != "none") | (j.optimizer.name == "adamw-8bit")
        ),
        "pipelines are traced with full fine-tuning, no activation compression, no 8-bit optimizer",
    ),
    Rule(
        "trace:deepspeed",
        "parallel",
        "DeepSpeed with tp, pp or offload params",
        lambda j: (_arr(j.parallel.tp) > 1) | _piped(j) | (_arr(j.parallel.offload) == "params"),
        "DeepSpeed's ZeRO is traced over data-parallel ranks alone (tp 1, pp 1), with ZeRO-Offload "
        "(offload = optimizer) but not parameter offload (ZeRO-Infinity), so far",
        value=lambda j: f"tp={j.parallel.tp} pp={j.parallel.pp} zero={j.parallel.zero} offload={j.parallel.offload}",
    ),
    Rule(
        "trace:deepspeed",
        "precision.grad_dtype",
        "fp32 gradients other than DeepSpeed's BF16 optimizer at ZeRO-1",
        lambda j: (j.precision.grad_dtype == "fp32") & ~(_bf16_optimizer(j) & (_arr(j.parallel.zero) == 1)),
        "fp32 gradients are traced as DeepSpeed's BF16 optimizer: mixed-bf16, backend deepspeed, zero 1",
        value=lambda j: "fp32",
    ),
    Rule(
        "trace:deepspeed",
        "finetune.method",
        "DeepSpeed with adapters, int8 activations or 8-bit AdamW",
        lambda j: (
            (j.finetune.method != "full") | (j.memory.act_compress != "none") | (j.optimizer.name == "adamw-8bit")
        ),
        "DeepSpeed's ZeRO is traced with full fine-tuning, no activation compression, no 8-bit optimizer",
    ),
)
