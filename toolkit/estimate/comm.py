"""Collectives of a training step: how often each backend runs them, what hides behind compute, and their cost.

    exposed = data_parallel_s(job, hw, a, ...)[1]      # gradient reduction and parameter gathers left in the step
    overlap_settings(job)                              # job.overlap, or each backend's default

One collective's cost (NCCL's ring and tree shapes) is toolkit.estimate.collectives', re-exported here;
toolkit.estimate.steptime prices the rest of the step and calls these.
"""

from __future__ import annotations

import numpy as np

from ..specs.backends import backends, is_megatron  # noqa: F401 - (re-exported: the estimate reads them here)
from ..specs.job import Job
from .collectives import bus_bw_bytes_per_s, latency_s, placement, ring_s
from .params import count_params, linear_params_per_layer
from .states import bytes_per_param
from .zero_buffers import pipelined_fsdp

__all__ = [
    "ring_s",
    "latency_s",
    "placement",
    "bus_bw_bytes_per_s",
    "ring_attention_s",
    "is_megatron",
    "backends",
    "overlap_settings",
    "data_parallel_s",
    "dp_collectives_s",
    "hidden_s",
    "tp_collectives_per_block",
    "tp_embedding_collectives",
    "TP_HEAD_COLLECTIVES",
    "TP_LOSS_COLLECTIVES",
]


TP_HEAD_COLLECTIVES = 1
"""The column-parallel output projection reads a replicated input: its gradient is all-reduced in backward
(under sequence parallelism: gathered in forward, reduce-scattered in backward), on the stage that holds it."""
TP_LOSS_COLLECTIVES = 3
"""Cross-entropy over vocabulary-sharded logits: the max, the sum of exponentials and the target's logit are
all-reduced across the group, one float per token each (Megatron's vocab_parallel_cross_entropy; torch's
loss_parallel does the same three)."""


def tp_collectives_per_block(job: Job):
    """All-reduces (or all-gather + reduce-scatter pairs, the same bytes) of a block's activation per micro-batch,
    as each backend's program runs them. Forward: after the attention output and after the MLP's down
    projection. Backward: one per group of column-parallel layers reading the same input - Megatron fuses q, k, v
    (and gate, up) into one layer, so one each; torch's DTensor plan keeps them apart and all-reduces each
    layer's partial input gradient (3 for attention, 1 or 2 for the MLP), unless sequence parallelism gathers
    their input once (one reduce-scatter then takes the summed gradient). Full recompute runs the forward's
    two again under Megatron; torch's checkpoint (full or per-op) stops recomputing at the last tensor backward
    needs, before the down projection's. tests/estimate/test_steptime.py counts what the runner's program issues."""
    megatron, deepspeed, torch_ = backends(job)
    separate = 3 + (2 if job.model.mlp == "swiglu" else 1)
    backward = np.where(torch_ & ~np.asarray(job.parallel.sp), separate, 2)
    checkpointed = np.isin(job.memory.recompute, ("full", "selective-op"))  # both rerun the block's collectives
    # torch stops before the down projection's reduction: o's all-reduce again, or under sp both gathers and o's
    # reduce-scatter (1.5 all-reduces' bytes)
    again = np.where(checkpointed, np.where(torch_, np.where(np.asarray(job.parallel.sp), 1.5, 1), 2), 0)
    return 2 + backward + again


def tp_embedding_collectives(job: Job):
    """A vocabulary-parallel embedding sums its rows' lookups: one all-reduce of the block activation in forward
    (Megatron under sequence parallelism: a reduce-scatter, and a gather in backward). torch's plan with learned
    positions and sp all-reduces, adds the positions to whole sequences and keeps its tokens, whose backward is
    one more gather (half an all-reduce's bytes)."""
    _megatron, _deepspeed, torch_ = backends(job)
    learned_sp = torch_ & np.asarray(job.parallel.sp) & (job.model.position == "learned")
    return np.where(learned_sp, 1.5, 1.0)


def ring_attention_s(job: Job, a, micro_tokens, attention_s, bw):
    """Context parallelism's ring, per block: each of cp − 1 steps passes this rank's keys and values on
    (forward), and keys, values and their gradients in backward (3× the forward's bytes) at `bw`, the achieved
    point-to-point bandwidth to its neighbour; the ring overlaps this with the attention products, so only what
    exceeds them shows, plus each step's latency (Liu et al. 2023)."""
    m, cp = job.model, np.asarray(job.parallel.cp)
    elem = job.precision.plan.compute_bytes
    kv_bytes = 2 * micro_tokens / cp * m.kv_heads_ * m.head_dim_ / np.asarray(job.parallel.tp) * elem
    ring_s = 3 * (cp - 1) * kv_bytes / bw
    return np.where(cp > 1, np.maximum(ring_s - attention_s, 0.0) + 3 * (cp - 1) * a.latency_intra_s, 0.0)


def overlap_settings(job: Job) -> dict:
    """The communication each layout hides behind compute: job.overlap where given, else its backend's default
    (torch: DDP and FSDP2 overlap reduce and prefetch gathers; DeepSpeed as the toolkit configures it: ZeRO-3's
    prefetch only; Megatron: nothing unless asked, but FSDP beside its tensor parallelism (ZeRO-3) overlaps both).
    Arrays over a grid, booleans for one job."""
    zero = np.asarray(job.parallel.zero)
    megatron, _deepspeed, torch_ = backends(job)
    ov = job.overlap
    # sharded weights beside Megatron's tensor parallelism are FSDP's (OPT's metaseq, Megatron-core's FSDP), which
    # prefetches gathers and overlaps its reduce-scatters; DeepSpeed's ZeRO-3 prefetches its gathers
    grad = torch_ | (megatron & (zero == 3)) if ov.grad_reduce is None else np.asarray(ov.grad_reduce)
    gather = torch_ | (zero == 3) if ov.param_gather is None else np.asarray(ov.param_gather)
    return {"grad_reduce": grad, "param_gather": gather, "tp_comm": np.asarray(ov.tp_comm)}


def data_parallel_s(job: Job, hw, a, trainable, n, stride, accum, micro_s, units):
    """(all, exposed) seconds of gradient reduction and parameter gathers over n replicas whose ranks sit
    `stride` apart, as each backend runs them: DDP all-reduces once a step (no_sync while accumulating), Megatron
    (its distributed optimizer keeps a whole fp32 gradient buffer) and ZeRO-1 reduce(-scatter) once a step;
    ZeRO-2/3 of FSDP2 and DeepSpeed reduce-scatter every micro-batch, as sharded gradients cannot accumulate
    whole. ZeRO-3 gathers in every micro-batch's forward and backward, FSDP2's ZeRO-2 in its forward; ZeRO-1,
    DeepSpeed's ZeRO-2 and Megatron's distributed optimizer gather the updated shards once after the step
    (torch's ZeRO-1 broadcasts them). FSDP2 under a pipeline schedule gathers each block once a step (its first
    forward) and reduce-scatters once, after the stage's last backward, with nothing left to hide behind.
    HSDP (parallel.dp_replicate = R): gathers and reduce-scatters within a shard group of n / R ranks, then each
    shard's gradient is all-reduced across its R copies (ranks n / R groups apart).

    Overlap: a micro-batch's collectives share one network and one compute window. Gathers prefetched block by
    block and reduce-scatters issued block by block queue on the same NICs, so what hides is their sum against
    the micro-batch's compute (`hidden_s`): the first block's gather and the last block's reduction always
    show. DDP's once-a-step all-reduce hides behind the last micro-batch's backward, bucket by bucket; gathers
    after the step behind the next forward."""
    zero = np.asarray(job.parallel.zero)
    megatron, deepspeed, torch_ = backends(job)
    ov = overlap_settings(job)
    if not a.comm_overlaps_compute:
        ov = {k: np.asarray(False) for k in ov}
    reduce_s, gather_s, buckets = dp_collectives_s(job, hw, a, trainable, n, stride, units)
    # sharded gradients cannot accumulate whole; Megatron's distributed optimizer accumulates in a full fp32
    # buffer and reduce-scatters once (its "ZeRO-2" shards only what the step keeps)
    piped = pipelined_fsdp(job)
    reduce_every_micro = (zero >= 2) & ~megatron & ~piped
    gathers_per_micro = np.where(piped, 0, np.where(zero == 3, 2, np.where((zero == 2) & torch_, 1, 0)))
    # ---- every micro-batch: its gathers and (sharded) reductions in its compute window ----
    micro_comm = gathers_per_micro * gather_s + np.where(reduce_every_micro, reduce_s, 0.0)
    edges = np.where(gathers_per_micro > 0, gather_s / units, 0.0) + np.where(
        reduce_every_micro, reduce_s / buckets, 0.0
    )
    both = ov["param_gather"] & np.where(reduce_every_micro, ov["grad_reduce"], True)
    micro_exposed = np.where(both, hidden_s(micro_comm, micro_s, edges), micro_comm)
    # a backend that overlaps only one of the two: that one hides alone, the other shows whole
    one_side = ~both & (ov["param_gather"] | ov["grad_reduce"])
    gathers_only = gathers_per_micro * gather_s
    reduces_only = np.where(reduce_every_micro, reduce_s, 0.0)
    micro_exposed = np.where(
        one_side & ov["param_gather"], hidden_s(gathers_only, micro_s, gather_s / units) + reduces_only, micro_exposed
    )
    micro_exposed = np.where(
        one_side & ov["grad_reduce"] & ~ov["param_gather"],
        gathers_only + hidden_s(reduces_only, micro_s * 2 / 3, reduce_s / buckets),
        micro_exposed,
    )
    # ---- once a step: the reduction (DDP, ZeRO-1, Megatron) in the last backward, gathers after the step ----
    step_reduce = np.where(reduce_every_micro, 0.0, reduce_s)
    step_reduce_exposed = np.where(
        ov["grad_reduce"] & ~piped, hidden_s(step_reduce, micro_s * 2 / 3, step_reduce / buckets), step_reduce
    )
    after_step = (zero >= 1) & (gathers_per_micro == 0) & ~piped
    ahead = ov["param_gather"] & ~(torch_ & (zero == 1))  # ZeroRedundancyOptimizer's broadcast never hides
    after_exposed = np.where(ahead, hidden_s(gather_s, micro_s / 3, gather_s / units), gather_s)
    once = np.where(piped, gather_s, 0.0)  # pipelines: the first forward's, block by block
    once_exposed = np.where(ov["param_gather"], hidden_s(once, micro_s, once / units), once)
    total = accum * micro_comm + step_reduce + np.where(after_step, gather_s, 0.0) + once
    exposed = accum * micro_exposed + step_reduce_exposed + np.where(after_step, after_exposed, 0.0) + once_exposed
    # over one rank FSDP2 still runs each collective's copies and hooks (fsdp_collective_s, when calibrated)
    paid = (np.asarray(n) > 1) | (torch_ & (zero >= 2))
    return np.where(paid, total, 0.0), np.where(paid, exposed, 0.0)


def dp_collectives_s(job: Job, hw, a, trainable, n, stride, units):
    """(reduction, one round of gathers, buckets) seconds of one micro-batch's data-parallel collectives over n
    replicas `stride` ranks apart: the gradients reduce-scattered (ZeRO ≥ 1 but torch's ZeRO-1) or all-reduced in
    buckets (FSDP2: a block each), and under HSDP all-reduced again across the shard's copies; the parameters
    gathered block by block (FSDP2 in bf16 under amp, float8 linears with fp8_all_gather). Each collective pays
    its latency, or calibrate's measured cost of an FSDP2 collective."""
    zero = np.asarray(job.parallel.zero)
    _megatron, _deepspeed, torch_ = backends(job)
    weight_b, grad_b, _o = bytes_per_param(job)
    gather_b = np.where(torch_ & (zero >= 2) & (job.precision.plan.family == "amp"), 2, weight_b)  # FSDP2's bf16
    if job.precision.fp8_all_gather and job.model.has_shape:  # the blocks' linear weights go as float8
        linear = job.model.layers * linear_params_per_layer(job.model) / count_params(job.model).total
        gather_b = gather_b * (1 - linear) + 1.0 * linear
    g = hw.gpus_per_node
    replicas = np.asarray(job.parallel.dp_replicate)
    n = np.maximum(np.asarray(n) // replicas, 1)  # n: the shard group's ranks from here on
    scatters = ~((zero == 0) | (torch_ & (zero == 1)))  # the rest all-reduce (2x the bytes)
    reduce_latency = np.where(scatters, latency_s(n, stride, g, a, "reduce_scatter"), latency_s(n, stride, g, a))
    gather_latency = latency_s(n, stride, g, a, "all_gather")
    if a.fsdp_collective_s is not None:  # measured as FSDP2 issues a block's collectives (calibrate)
        reduce_latency = np.where(torch_ & (zero >= 2), a.fsdp_collective_s, reduce_latency)
        gather_latency = np.where(torch_ & (zero >= 2), a.fsdp_collective_s, gather_latency)
    grad_bytes = trainable * grad_b
    # DDP and DeepSpeed reduce in buckets of bucket_bytes; FSDP2 reduce-scatters each wrapped block on its own
    buckets = np.where(torch_ & (zero >= 2), units, np.maximum(np.ceil(grad_bytes / a.bucket_bytes), 1))
    bus = np.where(
        scatters, bus_bw_bytes_per_s(n, stride, hw, a, "reduce_scatter"), bus_bw_bytes_per_s(n, stride, hw, a)
    )
    reduce_bw = np.where(
        scatters & (a.reduce_scatter_bw_bytes_per_s is not None), a.reduce_scatter_bw_bytes_per_s or 1.0, bus
    )
    reduce_s = ring_s(np.where(scatters, 1.0, 2.0), grad_bytes, n, reduce_bw) + buckets * reduce_latency
    across = stride * n  # HSDP: the shard's copies, a shard group apart
    reduce_s = (
        reduce_s
        + ring_s(2.0, grad_bytes / n, replicas, bus_bw_bytes_per_s(replicas, across, hw, a))
        + buckets * latency_s(replicas, across, g, a)
    )
    gather_bus = a.gather_bw_bytes_per_s or bus_bw_bytes_per_s(n, stride, hw, a, "all_gather")
    gather_s = ring_s(1.0, trainable * gather_b, n, gather_bus) + units * gather_latency
    return reduce_s, gather_s, buckets


def hidden_s(comm_s, window_s, edge_s):
    """What shows of `comm_s` seconds of collectives issued piece by piece beside `window_s` seconds of compute:
    the pieces that do not fit in the window, and at least the edge (the first gather before any compute, the
    last reduction after it)."""
    return np.maximum(comm_s - window_s, 0.0) + np.minimum(edge_s, comm_s)
