"""What the runner trains and the tracer measures, as one set of rules written once over arrays (no torch).

    refusal = run_refusal(job)        # None, or (field, value, reason): the first run rule the job breaks
    mask = runnable_mask(grid.job)    # every run rule passes, layout by layout (the planner's --runnable)
    check_traceable(job)              # SpecError naming the first trace rule the job breaks

The torch backend (toolkit.program) trains fp32, amp-* and pure-bf16: replicas (DDP), torch's ZeRO-1, ZeRO-2/3
(FSDP2, offload params included), HSDP, tensor and sequence parallelism (DTensor), dp × tp meshes, and pipelines
(GPipe, 1F1B, interleaved 1F1B; equal or uneven stages) alone, over dp, with ZeRO and tp inside; the mixed-* modes
as replicas with fp32 masters. The DeepSpeed backend trains the mixed-* modes (and fp32 where named) with
ZeRO-1/2/3 over dp, ZeRO-Offload included. Everything a rule refuses is still estimated. Each rule carries its
field, the condition in words and its one-line reason; docs/guide.md's table is `capability_markdown()`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .specs.backends import backend_masks, deepspeed_fp32
from .specs.job import Job
from .specs.precision import TORCH_SEMANTICS
from .specs.rules import interleaved_rounds_fit, named_backend_fits
from .specs.stages import uneven_fits

__all__ = [
    "Rule",
    "RULES",
    "run_refusal",
    "runnable_mask",
    "trace_path",
    "trace_refusal",
    "check_traceable",
    "capability_markdown",
]


@dataclass(frozen=True)
class Rule:
    who: str
    """run (the runner), trace (every tracer), or trace:fake, trace:pipeline, trace:deepspeed (one tracer path)."""
    field: str
    """The Job field to change, as the refusal names it."""
    when: str
    """The refused case in words (the docs' table)."""
    refuses: Callable[[Job], object]
    """True where the rule refuses: a bool, or a bool array over a layout grid's job."""
    reason: str | Callable[[Job], str]
    value: Callable[[Job], object] | None = None
    """The refused value, where it is not simply the field's."""
    name_field: Callable[[Job], str] | None = None
    """The field, where it depends on the job (tp or pp)."""

    def refusal(self, job: Job) -> tuple[str, object, str]:
        field = self.name_field(job) if self.name_field else self.field
        value = self.value(job) if self.value else _field_value(job, field)
        return field, value, self.reason(job) if callable(self.reason) else self.reason


def _field_value(job: Job, field: str):
    if field == "model":
        return job.model.name
    obj = job
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj


def _arr(x):
    return np.asarray(x)


def _backend_is(job: Job, name: str):
    """The job's program is `name`'s (megatron, deepspeed, torch), layout by layout: the named backend, or the one
    the mode and layout infer (Job.backend)."""
    par = job.parallel
    if par.backend is not None:
        return _arr(par.backend == name)
    megatron, deepspeed = backend_masks(job.precision.mode, par.zero, par.tp, par.pp)
    deepspeed = deepspeed | deepspeed_fp32(par.backend, job.precision.mode, par.zero, par.tp, par.pp)
    return {"megatron": megatron, "deepspeed": deepspeed, "torch": ~megatron & ~deepspeed}[name]


def _tp_or_pp(job: Job) -> str:
    return "parallel.tp" if job.parallel.tp > 1 else "parallel.pp"


def _split(job: Job):
    """No rank steps every whole matrix: sharded (ZeRO-2/3, tp), pipelined, or DeepSpeed's partitions."""
    par = job.parallel
    return (_arr(par.zero) >= 2) | (_arr(par.tp) > 1) | (_arr(par.pp) > 1) | _backend_is(job, "deepspeed")


def _replicas(job: Job):
    par = job.parallel
    return (_arr(par.zero) == 0) & (_arr(par.tp) == 1) & (_arr(par.pp) == 1)


def _accum(job: Job):
    return np.maximum(_arr(job.grad_accum if job.grad_accum is not None else 1), 1)


def _piped(job: Job):
    return _arr(job.parallel.pp) > 1


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


def _bf16_optimizer(job: Job):
    from .estimate.states import bf16_optimizer  # (the estimate's own test of DeepSpeed's BF16 optimizer)

    return _arr(bf16_optimizer(job))


def _torch_zero(job: Job):
    return (_arr(job.parallel.zero) > 0) & (job.precision.mode in TORCH_SEMANTICS)


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

RULES = RUN + TRACE
"""Every rule, the runner's first: what runs, then what each tracer measures."""


def run_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why the runner cannot train this resolved job (field, value, reason): the first run rule that refuses."""
    for rule in RUN:
        if bool(rule.refuses(job)):
            return rule.refusal(job)
    return None


def runnable_mask(job: Job) -> np.ndarray:
    """Every run rule passes, over a layout grid's array-valued job (toolkit.estimate.grid): the planner's
    `--runnable`. tests/train/test_capability.py checks it against run_refusal on each layout."""
    ok = np.asarray(True)
    for rule in RUN:
        ok = ok & ~_arr(rule.refuses(job))
    return ok


def trace_path(job: Job) -> str:
    """Which tracer measures the job: pipeline (pp > 1, gloo ranks), deepspeed (DeepSpeed's ZeRO, gloo ranks) or
    fake (one rank on fake tensors)."""
    if job.parallel.pp > 1:
        return "pipeline"
    if (
        bool(_arr(job.parallel.zero) > 0)
        and job.precision.mode not in TORCH_SEMANTICS
        or bool(
            deepspeed_fp32(
                job.parallel.backend, job.precision.mode, job.parallel.zero, job.parallel.tp, job.parallel.pp
            )
        )
    ):
        return "deepspeed"
    return "fake"


def trace_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why the tracer cannot measure this resolved job: the first trace rule of its path that refuses."""
    path = trace_path(job)
    for rule in TRACE:
        if rule.who in ("trace", f"trace:{path}") and bool(rule.refuses(job)):
            return rule.refusal(job)
    return None


def check_traceable(job: Job) -> None:
    """Raise the tracer's refusal as a SpecError (one line naming the field and the way out)."""
    from .specs.errors import SpecError

    refusal = trace_refusal(job)
    if refusal is not None:
        raise SpecError(*refusal)


def capability_markdown() -> str:
    """Every rule as docs/guide.md's table (tests/train/test_capability.py keeps the guide's copy equal to it)."""
    lines = ["| refused by | field | when | why |", "|---|---|---|---|"]
    for rule in RULES:
        reason = rule.reason if isinstance(rule.reason, str) else "(the reason names the job's figures)"
        who = {"run": "the runner", "trace": "every tracer"}.get(rule.who, f"the {rule.who[6:]} tracer")
        lines.append(f"| {who} | `{rule.field}` | {rule.when} | {reason} |")
    return "\n".join(lines)
