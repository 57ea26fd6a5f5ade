"""What the runner can train, in one place (no torch): `toolkit train`, the launcher and the planner ask here.

    refusal = run_refusal(job)      # None, or (field, value, reason) naming what to change

The runner trains the torch backend's program (toolkit.train.parallelize) for fp32, amp-* and pure-bf16:
data-parallel replicas (DDP), torch's ZeRO-1 (ZeroRedundancyOptimizer over DDP), ZeRO-2/3 (FSDP2, with or
without parameter offload), tensor and sequence parallelism (DTensor), and dp × tp meshes (DDP or FSDP2 over
dp). The mixed-* modes train as replicas with fp32 master weights. Rules are checked in order; the first that
applies is the reason given. Everything refused here is still estimated (and mostly traced).
"""
from __future__ import annotations

import numpy as np

from .specs.job import TORCH_SEMANTICS, Job

__all__ = ["run_refusal", "runnable_mask", "RUN_LAYOUTS"]

RUN_LAYOUTS = ("dp", "zero1", "zero2", "zero3", "zero2/3 + offload params", "tp", "tp + sp", "dp x tp",
               "dp x tp + zero2/3")
"""Layout families the runner trains (torch backend, fp32 / amp-* / pure-bf16)."""


def _layout_rules(job: Job):
    par, mode = job.parallel, job.precision.mode
    torch_mode = mode in TORCH_SEMANTICS
    yield par.pp > 1, ("parallel.pp", par.pp, "the runner does not train pipelines yet (they are estimated and "
                                              "traced); set parallel.pp = 1")
    yield par.zero > 0 and not torch_mode, (
        "parallel.zero", par.zero, f"{mode} with ZeRO is DeepSpeed's program, which the runner does not train yet; "
                                   "use amp-bf16 (torch's ZeRO: FSDP2) or zero 0")
    yield par.tp > 1 and not torch_mode, (
        "parallel.tp", par.tp, f"{mode} with tensor parallelism is Megatron's program (estimated only); use fp32, "
                               "amp-* or pure-bf16 (torch's DTensor plan)")
    yield par.tp > 1 and par.zero == 1, (
        "parallel.zero", 1, "torch's ZeRO-1 (ZeroRedundancyOptimizer) does not take tensor-parallel parameters; "
                            "use zero 2 or 3 with tp")
    yield par.offload == "optimizer", (
        "parallel.offload", "optimizer", "optimizer-only offload is DeepSpeed's ZeRO-Offload, which the runner does "
                                         "not train yet; the torch backend offloads with zero 2/3 and offload params")
    yield par.offload == "params" and par.zero < 2, (
        "parallel.offload", "params", "FSDP2 offloads sharded states: needs zero 2 or 3")


def _technique_rules(job: Job):
    par = job.parallel
    sharded = par.zero >= 2 or par.tp > 1
    yield job.precision.grad_dtype == "fp32" and (par.zero > 0 or par.tp > 1), (
        "precision.grad_dtype", "fp32", "fp32 main gradients are trained with replicas (zero 0, tp 1); use param")
    yield job.finetune.adapters and (par.zero > 0 or par.tp > 1), (
        "finetune.method", job.finetune.method, "adapters are trained with replicas (zero 0, tp 1)")
    yield job.optimizer.name == "adamw-8bit" and (par.zero > 0 or par.tp > 1), (
        "optimizer.name", "adamw-8bit", "bitsandbytes' 8-bit AdamW is trained with replicas (zero 0, tp 1)")
    yield job.memory.act_compress == "int8" and sharded, (
        "memory.act_compress", "int8", "int8 saved activations are trained with replicas or ZeRO-1")
    yield job.memory.act_compress == "int8" and job.memory.recompute == "full", (
        "memory.act_compress", "int8", "full recompute keeps only block inputs, which the runner does not "
                                       "compress: choose int8 or full recompute")
    yield job.training.pruning.method != "none" and sharded, (
        "training.pruning.method", job.training.pruning.method, "pruning masks whole matrices: train it with "
                                                                "replicas or ZeRO-1")
    yield job.training.fp32_norm and sharded and job.precision.mode != "fp32", (
        "training.fp32_norm", True, "FP32 norms inside FSDP2 or tensor-parallel units are not trained yet; "
                                    "use replicas or ZeRO-1")
    yield job.precision.mode == "amp-fp16" and sharded, (
        "precision.mode", "amp-fp16", "fp16 loss scaling over sharded gradients is not trained yet; use amp-bf16")
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
    recompute = np.asarray(job.memory.recompute)
    sharded = (zero >= 2) | (tp > 1)
    ok = (pp == 1) & (offload != "optimizer") & ((offload != "params") | (zero >= 2)) & ~((tp > 1) & (zero == 1))
    if mode not in TORCH_SEMANTICS:
        ok &= (zero == 0) & (tp == 1)
    if job.precision.grad_dtype == "fp32" or job.finetune.adapters or job.optimizer.name == "adamw-8bit":
        ok &= (zero == 0) & (tp == 1)
    if job.memory.act_compress == "int8":
        ok &= ~sharded & (recompute != "full")
    if job.training.pruning.method != "none" or mode == "amp-fp16" or (job.training.fp32_norm and mode != "fp32"):
        ok &= ~sharded
    if not job.model.has_shape or job.model.encoder:
        ok &= False
    return ok
