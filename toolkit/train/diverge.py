"""What a diverged run says when it stops: a non-finite loss or gradient norm, or an fp16 loss scale that fell
below 1, each with the change that fixes it (the runner stops before the update and keeps its last checkpoint)."""

from __future__ import annotations

import math

from ..specs import Job
from ..specs.precision import compute_dtype

__all__ = ["diagnose_nonfinite", "loss_scale_underflow"]


def diagnose_nonfinite(job: Job, step: int, lr: float, loss: float, grad_norm: float) -> str:
    """Why a run stopped on a non-finite loss or gradient norm before the update, and what to change."""
    what = "loss" if not math.isfinite(loss) else "gradient norm"
    hints = [f"lower training.lr (now {job.training.lr:g}; try {job.training.lr / 3:.2g})"]
    if job.training.warmup_steps < 0.02 * job.training.steps:
        hints.append("lengthen training.warmup_steps")
    if job.training.grad_clip == 0:
        hints.append("turn on training.grad_clip (1.0)")
    if compute_dtype(job.precision.mode) == "fp16":
        hints.append("or use a bf16 mode, whose range is fp32's")
    return (
        f"{what} became {loss if what == 'loss' else grad_norm} at step {step + 1} (lr {lr:.3g}): the run diverged "
        f"and was stopped before the update. Fix: {'; '.join(hints)}. Resume from the last checkpoint after the change."
    )


def loss_scale_underflow(scale: float, step: int) -> str:
    """Why an fp16 run stopped when its loss scale fell below 1, and what to change."""
    return (
        f"the fp16 loss scale fell to {scale:g} at step {step + 1}: gradients overflow fp16 "
        "at every scale, so the loss diverged or activations exceed fp16's range (65504). Fix: lower "
        "training.lr, or train in a bf16 mode (amp-bf16, mixed-bf16), whose range is fp32's."
    )
