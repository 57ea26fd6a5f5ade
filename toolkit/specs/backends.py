"""Which framework's program a layout follows: torch's, DeepSpeed's or Megatron's. The estimator models each
framework for its own layouts, so the rule that picks one is shared by the Job, its checks and the planner's grid."""

from __future__ import annotations

import numpy as np

from .precision import TORCH_SEMANTICS

__all__ = [
    "backend_masks",
    "infer_backend",
    "deepspeed_fp32",
    "job_deepspeed_fp32",
    "bf16_optimizer",
    "backends",
    "is_megatron",
]


def backend_masks(mode: str, zero, tp, pp):
    """(megatron, deepspeed): which layouts follow Megatron's or DeepSpeed's program, as booleans over arrays of
    layouts (the planner's grid) or one. mixed-* (16-bit weights, fp32 masters) with tp or pp is Megatron's (its
    distributed optimizer being ZeRO-1), mixed-* with ZeRO over dp alone DeepSpeed's; everything else torch's."""
    mixed = mode not in TORCH_SEMANTICS
    megatron = mixed & ((np.asarray(tp) > 1) | (np.asarray(pp) > 1))
    return megatron, mixed & (np.asarray(zero) > 0) & ~megatron


def infer_backend(mode: str, zero: int, tp: int, pp: int) -> str:
    """The framework one layout's program follows (`backend_masks`' rule)."""
    megatron, deepspeed = backend_masks(mode, zero, tp, pp)
    return "megatron" if megatron else "deepspeed" if deepspeed else "torch"


def deepspeed_fp32(backend, mode: str, zero, tp, pp):
    """DeepSpeed's engine in fp32 (no bf16 or fp16 section: fp32 weights, and still its fp32 copy of each rank's
    partition), with ZeRO over dp alone: only where parallel.backend names deepspeed, since unnamed, fp32 with ZeRO
    is torch's program (FSDP2, ZeroRedundancyOptimizer). Booleans over arrays of layouts, or one."""
    return (
        (np.asarray(backend == "deepspeed"))
        & (mode == "fp32")
        & (np.asarray(zero) > 0)
        & (np.asarray(tp) == 1)
        & (np.asarray(pp) == 1)
    )


def job_deepspeed_fp32(job):
    """`deepspeed_fp32` of a resolved job (its layout fields may be arrays: the planner's grid)."""
    par = job.parallel
    return deepspeed_fp32(par.backend, job.precision.mode, par.zero, par.tp, par.pp)


def bf16_optimizer(job):
    """Where DeepSpeed runs its BF16 optimizer: mixed-bf16 with fp32 gradient accumulation (precision.grad_dtype
    fp32, DeepSpeed's data_types.grad_accum_dtype) at ZeRO 0 or 1 under DeepSpeed's engine, named as
    parallel.backend deepspeed (with or without its pipeline; unnamed, fp32 gradients read as Megatron's main
    gradients). It keeps an fp32 gradient buffer of the whole stage, not sharded, beside the bf16 gradients
    ("4 bytes x params and it's not sharded", BigScience's BLOOM chronicles, 2022-02-28). Arrays in, arrays out."""
    par = job.parallel
    return (
        (job.precision.mode == "mixed-bf16")
        & (job.precision.grad_dtype == "fp32")
        & (par.backend == "deepspeed")
        & (np.asarray(par.zero) <= 1)
    )


def backends(job):
    """(megatron, deepspeed, torch) over a layout grid: which program each layout follows (Job.backend)."""
    par = job.parallel
    if par.backend is not None:
        megatron, deepspeed = np.asarray(par.backend == "megatron"), np.asarray(par.backend == "deepspeed")
    else:
        megatron, deepspeed = backend_masks(job.precision.mode, par.zero, par.tp, par.pp)
    return megatron, deepspeed, ~megatron & ~deepspeed


def is_megatron(job):
    """Job.backend == "megatron", for layouts whose tp and pp may be arrays (the planner's grid)."""
    return backends(job)[0]
