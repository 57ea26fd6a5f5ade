"""What a precision mode means, decoded in one place and without torch: the dtypes of the weights, gradients,
optimizer states and matmuls, and the machinery around them (fp32 master weights, autocast, loss scaling).

    plan = precision_plan("mixed-bf16")
    plan.weights, plan.grads, plan.optimizer_states, plan.compute      # 'bf16', 'bf16', 'fp32', 'bf16'
    plan.master_weights, plan.autocast, plan.loss_scaling              # True, None, False

The estimator reads byte counts from it, the runner and the tracer map its dtype names to torch's
(toolkit.program.precision.TORCH_DTYPES), the catalog's peaks are keyed by `compute`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from .errors import SpecError

__all__ = ["PRECISIONS", "TORCH_SEMANTICS", "DTYPE_BYTES", "PrecisionPlan", "precision_plan", "compute_dtype"]

PRECISIONS = ("fp32", "amp-bf16", "amp-fp16", "mixed-bf16", "mixed-fp16", "pure-bf16")
TORCH_SEMANTICS = ("fp32", "amp-bf16", "amp-fp16", "pure-bf16")
"""Modes that follow torch: DDP, ZeroRedundancyOptimizer (ZeRO-1), FSDP2 (ZeRO-2/3). `mixed-*` follow DeepSpeed."""
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class PrecisionPlan:
    mode: str
    family: str
    """fp32 | amp (torch autocast over fp32 weights) | mixed (16-bit weights, fp32 masters) | pure (all bf16)."""
    weights: str
    """The dtype of the parameters the model holds, and of their gradients (`grads`)."""
    optimizer_states: str
    """Adam's moments (and SGD's momentum): fp32, except under pure-bf16."""
    compute: str
    """The dtype the matmuls run in: fp32 under fp32 (torch leaves TF32 off for matmuls), else the 16-bit one."""
    master_weights: bool
    """An fp32 copy of the weights that the optimizer steps (mixed-*)."""
    autocast: str | None
    """torch.autocast's dtype (amp-*), else None."""
    loss_scaling: bool
    """fp16's narrow range needs the loss scaled (amp-fp16, mixed-fp16)."""

    @property
    def grads(self) -> str:
        return self.weights

    @property
    def half(self) -> str | None:
        """The mode's 16-bit dtype, None under fp32."""
        return None if self.family == "fp32" else self.compute

    @property
    def weight_bytes(self) -> int:
        return DTYPE_BYTES[self.weights]

    @property
    def state_bytes(self) -> int:
        return DTYPE_BYTES[self.optimizer_states]

    @property
    def compute_bytes(self) -> int:
        """Bytes of a matmul's operands and outputs: activations, logits, gathered 16-bit weights."""
        return DTYPE_BYTES[self.compute]


@functools.cache
def precision_plan(mode: str) -> PrecisionPlan:
    """Decode a precision mode (one of PRECISIONS)."""
    if mode not in PRECISIONS:
        raise SpecError("precision.mode", mode, f"allowed: {', '.join(PRECISIONS)}")
    if mode == "fp32":
        return PrecisionPlan(mode, "fp32", "fp32", "fp32", "fp32", False, None, False)
    family, half = mode.split("-")
    if family == "amp":
        return PrecisionPlan(mode, family, "fp32", "fp32", half, False, half, half == "fp16")
    if family == "mixed":
        return PrecisionPlan(mode, family, half, "fp32", half, True, None, half == "fp16")
    return PrecisionPlan(mode, family, half, half, half, False, None, False)  # pure-bf16


def compute_dtype(mode: str) -> str:
    """The dtype the matmuls run in (the catalog's peaks are keyed by it)."""
    return precision_plan(mode).compute
