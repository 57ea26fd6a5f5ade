"""What a trace returns (one device's measured bytes and FLOPs), shared by every tracer: the single process
(toolkit.trace.memory), the pipeline's and DeepSpeed's ranks (toolkit.trace.pipeline, zero, ranks)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceResult", "MAX_TRACED_MICRO_BATCHES"]

MAX_TRACED_MICRO_BATCHES = 2
"""Micro-batches traced per step: from the second on, every one repeats the same memory pattern."""


@dataclass(frozen=True)
class TraceResult:
    params_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activations_bytes: int
    peak_bytes: int
    peak_breakdown: dict[str, int]
    """MemTracker's categories at the moment of the peak."""
    boundary_breakdown: dict[str, int]
    """MemTracker's categories at the forward/backward boundary of the last micro-batch."""
    flops_per_token: float = 0.0
    """FlopCounterMode's count for one micro-batch (forward, backward, recompute), per token. It counts every
    matmul, eager attention over the full score matrix, and the CPU flash kernel as 0."""
    program: str = "cpu"
    host_bytes: int = 0
    """Offload: what stays in host memory (sharded parameters, gradients, optimizer states); the fields above
    and the peak are then the device's."""
    stage_peaks_bytes: tuple[int, ...] = ()
    """Pipeline traces: every stage's peak (the fields above are the busiest stage's)."""
