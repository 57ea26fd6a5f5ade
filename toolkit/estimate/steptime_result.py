"""What a training step's time model returns: the step's seconds by part (the JSON contract's `time.breakdown`),
its model FLOPs and MFU, and one user-measured scale applied to every part (toolkit calibrate --step-s)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

__all__ = ["StepTime", "SCALED_FIELDS", "COMMUNICATION_FIELDS", "scaled"]


@dataclass(frozen=True)
class StepTime:
    compute_s: float
    """Matmuls (with recompute) of all micro-batches, at the shape-dependent efficiency."""
    memory_bound_s: float
    """Element-wise and normalisation kernels of all micro-batches."""
    overhead_s: float
    """The fixed cost of every operation of the step (Assumptions.op_overhead_s; 0 on catalog accelerators)."""
    tp_comm_s: float
    """Tensor-parallel all-reduces (not overlapped)."""
    cp_comm_s: float
    """Context parallelism's ring passes left after overlap with the attention products."""
    dp_comm_exposed_s: float
    """Data-parallel / ZeRO communication left after overlap with backward."""
    pp_comm_s: float
    """Pipeline point-to-point sends."""
    bubble_s: float
    """Pipeline fill and drain."""
    optimizer_s: float
    """The optimizer step (and offload transfers)."""
    model_flops: float
    """Model FLOPs of the whole step over all devices (MFU's numerator)."""
    tokens: float
    devices: int
    peak_flops: float
    gemm_efficiency: float
    """The matmul efficiency the shapes allow (≤ gemm_fraction)."""
    dp_comm_s: float
    """Data-parallel communication before overlap."""
    stage_micro_s: tuple = ()
    """One micro-batch's forward and backward on the first, a middle and the last pipeline rank (compute, memory,
    tp and cp): what `toolkit.estimate.pipeline.simulate` takes for uneven stages."""
    ep_comm_s: float = 0.0
    """Expert parallelism's all-to-alls (dispatch and combine, forward and backward; not overlapped)."""

    @property
    def step_s(self):
        return (
            self.compute_s
            + self.memory_bound_s
            + self.overhead_s
            + self.tp_comm_s
            + self.cp_comm_s
            + self.ep_comm_s
            + self.dp_comm_exposed_s
            + self.pp_comm_s
            + self.bubble_s
            + self.optimizer_s
        )

    @property
    def tokens_per_s(self):
        return self.tokens / self.step_s

    @property
    def mfu(self):
        return self.model_flops / (self.devices * self.peak_flops * self.step_s)

    def breakdown(self) -> dict:
        """Seconds per part (the keys of the JSON contract's `time.breakdown`)."""
        parts = (
            "compute_s",
            "memory_bound_s",
            "overhead_s",
            "tp_comm_s",
            "cp_comm_s",
            "ep_comm_s",
            "dp_comm_exposed_s",
            "pp_comm_s",
            "bubble_s",
            "optimizer_s",
        )
        return {name: getattr(self, name) for name in parts}


SCALED_FIELDS = (
    "compute_s",
    "memory_bound_s",
    "overhead_s",
    "tp_comm_s",
    "cp_comm_s",
    "dp_comm_exposed_s",
    "pp_comm_s",
    "bubble_s",
    "optimizer_s",
    "dp_comm_s",
    "ep_comm_s",
)


COMMUNICATION_FIELDS = ("tp_comm_s", "cp_comm_s", "dp_comm_exposed_s", "pp_comm_s", "dp_comm_s", "ep_comm_s")
"""The parts a second calibrated scale moves (toolkit calibrate with two or more measured layouts): the collectives;
the rest (matmuls, element-wise work, the pipeline's idle time, the optimizer) takes the compute scale."""


def scaled(st: StepTime, scale: float, communication_scale: float | None = None) -> StepTime:
    """Every part of the step times `scale`: a user's measured step on this accelerator against the modelled one
    (toolkit calibrate --step-s); with a `communication_scale` (two or more measured layouts tell them apart) the
    collectives take that one instead."""
    comm = scale if communication_scale is None else communication_scale
    if scale == 1.0 and comm == 1.0:
        return st
    parts = {name: getattr(st, name) * (comm if name in COMMUNICATION_FIELDS else scale) for name in SCALED_FIELDS}
    return dataclasses.replace(st, **parts, stage_micro_s=tuple(t * scale for t in st.stage_micro_s))
