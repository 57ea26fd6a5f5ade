"""What the runner can train, in one place (no torch): `toolkit train`, the launcher and the planner ask here.

    refusal = run_refusal(job)      # None, or (field, value, reason) naming what to change

The torch backend (toolkit.program.parallelize, toolkit.program.pipeline) trains fp32, amp-* and pure-bf16:
data-parallel replicas (DDP), torch's ZeRO-1 (ZeroRedundancyOptimizer over DDP), ZeRO-2/3 (FSDP2, with or
without parameter offload), tensor and sequence parallelism (DTensor), dp × tp meshes (DDP or FSDP2 over
dp), and pipelines (torch's GPipe, 1F1B and interleaved 1F1B schedules, equal or uneven stages) alone,
replicated over dp (with ZeRO-1's sharded optimizer) or FSDP2-sharded over it (ZeRO-2/3, offload included), tensor-parallel within each stage (tp × pp, dp × tp × pp); the mixed-* modes as replicas
with fp32 master weights. The DeepSpeed backend (toolkit.program.deepspeed) trains the mixed-* modes, and
fp32 where parallel.backend names it, with ZeRO-1/2/3 over dp, ZeRO-Offload included. Megatron's program (mixed-* with tp or pp) and context parallelism are estimated only. Rules are checked in
order; the first that applies is the reason given. Everything refused here is still estimated (and mostly
traced). CAPABILITIES is the same as a table, for docs/guide.md.
"""
from __future__ import annotations

import numpy as np

from .specs.backends import deepspeed_fp32
from .specs.job import Job, backend_masks
from .specs.rules import interleaved_rounds_fit, named_backend_fits
from .specs.stages import uneven_fits

__all__ = ["run_refusal", "runnable_mask", "RUN_LAYOUTS", "CAPABILITIES", "capability_markdown"]

RUN_LAYOUTS = ("dp", "zero1", "zero2", "zero3", "zero2/3 + offload params", "tp", "tp + sp", "dp x tp",
               "dp x tp + zero2/3", "pp (GPipe, 1F1B, interleaved 1F1B)", "dp x pp", "dp x pp + zero1/2/3",
               "dp x pp + zero2/3 + offload params", "tp x pp",
               "dp x tp x pp",
               "DeepSpeed zero1/2/3 (+ offload optimizer)")
"""Layout families the runner trains."""

CAPABILITIES = (   # (backend, layout, precision modes, estimated, traced, run)
    ("torch", "dp (DDP), ZeRO-1 (ZeroRedundancyOptimizer)", "fp32, amp-*, pure-bf16; mixed-* at zero 0", True, True,
     True),
    ("torch", "ZeRO-2/3 (FSDP2), + offload params", "fp32, amp-bf16, pure-bf16", True, True, True),
    ("torch", "tp, tp + sp, dp x tp (+ ZeRO-2/3)", "fp32, amp-bf16, pure-bf16", True, True, True),
    ("torch", "pp: GPipe, 1F1B, interleaved 1F1B, equal or uneven stages; dp x pp", "fp32, amp-bf16, pure-bf16",
     True, True, True),
    ("torch", "tp x pp, dp x tp x pp (tp + sp included)", "fp32, amp-bf16, pure-bf16", True, True, True),
    ("torch", "pp with ZeRO-1 (ZeroRedundancyOptimizer over each stage's dp ranks)", "fp32, amp-bf16, pure-bf16",
     True, True, True),
    ("torch", "pp with ZeRO-2/3: FSDP2 stages over dp, gathered through the step (torchtitan's)",
     "fp32, amp-bf16, pure-bf16", True, True, True),
    ("torch", "pp with ZeRO-2/3 + offload params (FSDP2's CPUOffloadPolicy per stage)", "fp32, amp-bf16, pure-bf16",
     True, True, True),
    ("deepspeed", "ZeRO-1/2/3 over dp, + offload optimizer (ZeRO-Offload)",
     "mixed-bf16 (mixed-fp16 on GPUs); fp32 where backend: deepspeed", True, True, True),
    ("deepspeed", "offload params (ZeRO-Infinity)", "mixed-*", True, False, False),
    ("deepspeed", "tp, pp, dp x tp x pp at ZeRO 0/1 (Megatron-DeepSpeed; its BF16 optimizer with grad_dtype fp32)",
     "mixed-*", True, False, False),
    ("megatron", "tp, sp, pp, dp x tp x pp (with ZeRO-1 over dp)", "mixed-*", True, False, False),
    ("any", "context parallelism (cp: ring attention)", "all", True, False, False),
    ("any", "FP8 matmuls, FSDP2's float8 all-gather (fp8, fp8_all_gather)", "amp-*, mixed-*", True, False, False),
)
"""What each backend's layouts are: estimated (toolkit.estimate), traced (toolkit.trace), run (toolkit train).
Techniques with their own limits (adapters, 8-bit AdamW, int8 activations, pruning, FP32 norms, fp32 main
gradients) run where `run_refusal` lets them."""


def _layout_rules(job: Job):
    par, mode, backend = job.parallel, job.precision.mode, job.backend
    yield backend == "megatron", (
        "parallel.tp" if par.tp > 1 else "parallel.pp", par.tp if par.tp > 1 else par.pp,
        f"{mode} with tensor or pipeline parallelism is Megatron's program (estimated only); use fp32, amp-* or "
        "pure-bf16 (torch's DTensor plan and pipeline schedules)")
    yield backend == "deepspeed" and (par.tp > 1 or par.pp > 1), (
        "parallel.tp" if par.tp > 1 else "parallel.pp", par.tp if par.tp > 1 else par.pp,
        "DeepSpeed's engine around Megatron's tensor parallelism and DeepSpeed's pipeline (Megatron-DeepSpeed) "
        "is estimated, not run; use fp32, amp-* or pure-bf16 (torch's DTensor plan and pipeline schedules)")
    yield backend == "deepspeed" and par.offload == "params", (
        "parallel.offload", "params", "DeepSpeed's parameter offload (ZeRO-Infinity) is estimated, not run; use "
                                      "offload optimizer (ZeRO-Offload), or amp-bf16 with FSDP2's offload params")
    yield par.cp > 1, (
        "parallel.cp", par.cp, "context parallelism is estimated, not run: torch's ring attention needs CUDA's "
                               "attention kernels; use cp 1")
    yield par.tp > 1 and par.zero == 1, (
        "parallel.zero", 1, "torch's ZeRO-1 (ZeroRedundancyOptimizer) does not take tensor-parallel parameters; "
                            "use zero 2 or 3 with tp")
    yield par.offload == "params" and par.zero < 2, (
        "parallel.offload", "params", "FSDP2 offloads sharded states: needs zero 2 or 3")
    yield par.dp_replicate > 1 and (par.tp > 1 or par.pp > 1), (
        "parallel.dp_replicate", par.dp_replicate, "HSDP beside tensor or pipeline parallelism is estimated, not run; "
                                                   "train HSDP with tp 1 and pp 1")
    yield from _pipeline_rules(job)


def _pipeline_rules(job: Job):
    par, m = job.parallel, job.grad_accum or 1
    if par.pp == 1:
        return
    yield par.offload == "optimizer", (
        "parallel.offload", par.offload, "pipelines offload FSDP2's shards (offload params, zero 2 or 3); DeepSpeed's "
                                         "optimizer offload under pipelines is estimated, not run")
    yield par.vpp > 1 and par.schedule == "gpipe", (
        "parallel.schedule", "gpipe", "interleaved stages (vpp > 1) run the interleaved 1F1B schedule; set "
                                      "schedule: 1f1b or vpp: 1")
    yield par.vpp == 1 and m < par.pp, (
        "batch.global_batch", job.batch.global_batch,
        f"{m} micro-batches per step for {par.pp} stages: torch's schedules need at least one per stage (raise "
        "global_batch or lower micro_batch)")
    yield par.vpp > 1 and m % max(1, m // par.pp) != 0, (
        "batch.global_batch", job.batch.global_batch,
        f"interleaved 1F1B runs the {m} micro-batches in rounds of {par.pp}: make their number a multiple of pp")


def _technique_rules(job: Job):
    par = job.parallel
    sharded = par.zero >= 2 or par.tp > 1
    split = sharded or par.pp > 1 or job.backend == "deepspeed"     # no rank steps every whole matrix
    replicas = par.zero == 0 and par.tp == 1 and par.pp == 1
    yield job.precision.grad_dtype == "fp32" and not replicas, (
        "precision.grad_dtype", "fp32", "fp32 main gradients are trained with replicas (zero 0, tp 1, pp 1); use param")
    yield job.finetune.adapters and not replicas, (
        "finetune.method", job.finetune.method, "adapters are trained with replicas (zero 0, tp 1, pp 1)")
    yield job.optimizer.name == "adamw-8bit" and not replicas, (
        "optimizer.name", "adamw-8bit", "bitsandbytes' 8-bit AdamW is trained with replicas (zero 0, tp 1, pp 1)")
    yield job.memory.act_compress == "int8" and split, (
        "memory.act_compress", "int8", "int8 saved activations are trained with replicas or torch's ZeRO-1")
    yield job.memory.act_compress == "int8" and job.memory.recompute == "full", (
        "memory.act_compress", "int8", "full recompute keeps only block inputs, which the runner does not "
                                       "compress: choose int8 or full recompute")
    yield job.training.pruning.method != "none" and split, (
        "training.pruning.method", job.training.pruning.method, "pruning masks whole matrices: train it with "
                                                                "replicas or torch's ZeRO-1")
    yield job.training.fp32_norm and split and job.precision.mode != "fp32", (
        "training.fp32_norm", True, "FP32 norms inside FSDP2, tensor-parallel, pipeline or DeepSpeed units are "
                                    "not trained yet; use replicas or torch's ZeRO-1")
    yield job.precision.mode == "amp-fp16" and split, (
        "precision.mode", "amp-fp16", "fp16 loss scaling over sharded gradients or pipeline schedules is not "
                                      "trained yet; use amp-bf16")
    yield job.precision.fp8, (
        "precision.fp8", True, "FP8 matmuls (and FSDP2's float8 all-gather) are estimated, not run: the runner's "
                               "matmuls are the mode's dtype; drop fp8")
    yield not job.model.has_shape or job.model.encoder, (
        "model", job.model.name, "the runner trains decoder models with layers, hidden and heads")


def run_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why the runner cannot train this resolved job (field, value, reason), or None when it can."""
    for applies, reason in (*_layout_rules(job), *_technique_rules(job)):
        if applies:
            return reason
    return None


def runnable_mask(job: Job) -> np.ndarray:
    """`run_refusal(job) is None` over a layout grid's array-valued job (toolkit.estimate.grid), vectorised for
    the planner's `--runnable`. The same rules as above; tests/test_capability.py checks both agree on grids."""
    par, mode = job.parallel, job.precision.mode
    tp, pp, zero, offload = (np.asarray(x) for x in (par.tp, par.pp, par.zero, par.offload))
    vpp, schedule = np.asarray(par.vpp), np.asarray(par.schedule)
    m = np.maximum(np.asarray(job.grad_accum if job.grad_accum is not None else 1), 1)
    recompute = np.asarray(job.memory.recompute)
    megatron, deepspeed = backend_masks(mode, zero, tp, pp)
    deepspeed = deepspeed | deepspeed_fp32(par.backend, mode, zero, tp, pp)
    sharded = (zero >= 2) | (tp > 1)
    split = sharded | (pp > 1) | deepspeed
    replicas = (zero == 0) & (tp == 1) & (pp == 1)
    ok = ~megatron & ~(deepspeed & (offload == "params")) & ((offload != "params") | (zero >= 2)) \
        & ~((tp > 1) & (zero == 1))
    ok &= named_backend_fits(par.backend, mode, zero, tp, pp)
    ok &= np.asarray(par.cp) == 1
    ok &= (np.asarray(par.dp_replicate) == 1) | ((tp == 1) & (pp == 1))
    stages_ok = ((offload != "optimizer") & uneven_fits(job.model.layers, pp, vpp)
                 & ~((vpp > 1) & (schedule == "gpipe")) & np.where(vpp == 1, m >= pp, interleaved_rounds_fit(m, pp)))
    ok &= (pp == 1) | stages_ok
    if job.precision.grad_dtype == "fp32" or job.finetune.adapters or job.optimizer.name == "adamw-8bit":
        ok &= replicas
    if job.memory.act_compress == "int8":
        ok &= ~split & (recompute != "full")
    if job.training.pruning.method != "none" or mode == "amp-fp16" or (job.training.fp32_norm and mode != "fp32"):
        ok &= ~split
    if not job.model.has_shape or job.model.encoder or job.precision.fp8:
        ok &= False
    return ok


def capability_markdown() -> str:
    """CAPABILITIES as docs/guide.md's table (tests/train/test_capability.py keeps the guide's copy equal to it)."""
    mark = {True: "yes", False: "—"}
    lines = ["| backend | layout | precision | estimated | traced | run |", "|---|---|---|---|---|---|"]
    lines += [f"| {backend} | {layout} | {modes} | {mark[est]} | {mark[traced]} | {mark[run]} |"
              for backend, layout, modes, est, traced, run in CAPABILITIES]
    return "\n".join(lines)
