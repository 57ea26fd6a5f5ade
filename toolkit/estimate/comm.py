"""Collectives of a training step: how often each backend runs them, what hides behind compute, and their cost.

    exposed = data_parallel_s(job, hw, a, ...)[1]      # gradient reduction and parameter gathers left in the step
    overlap_settings(job)                              # job.overlap, or each backend's default

The ring and tree costs are NCCL's shapes (bandwidth term 2(n−1)/n·S/B for an all-reduce, a ring inside a node,
a tree across nodes); toolkit.estimate.steptime prices the rest of the step and calls these.
"""
from __future__ import annotations

import numpy as np

from ..specs.job import Job, backend_masks
from .params import count_params, linear_params_per_layer
from .states import bytes_per_param
from .zero_buffers import pipelined_fsdp

__all__ = ["ring_s", "latency_s", "ring_attention_s", "is_megatron", "backends", "overlap_settings",
           "data_parallel_s", "tp_collectives_per_block", "tp_embedding_collectives", "TP_HEAD_COLLECTIVES",
           "TP_LOSS_COLLECTIVES"]


def ring_s(volume_factor, size_bytes, n, bw, a):
    """Bandwidth time of a ring collective moving volume_factor·(n−1)/n·size over bandwidth bw."""
    n = np.asarray(n, dtype=float)
    return np.where(n > 1, volume_factor * np.maximum(n - 1, 0) / np.maximum(n, 1) * size_bytes
                    / (bw * a.link_efficiency), 0.0)


def latency_s(n, gpus_per_node: int, a):
    """Start-up cost of one all-reduce over n ranks: a ring inside the node, a tree across nodes (as NCCL
    picks for large groups), there and back."""
    n = np.asarray(n, dtype=float)
    inside = np.minimum(n, gpus_per_node)
    nodes = np.maximum(n / gpus_per_node, 1)
    return np.where(n > 1, 2 * (inside - 1) * a.latency_intra_s + 2 * np.ceil(np.log2(nodes)) * a.latency_inter_s,
                    0.0)


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
    checkpointed = np.isin(job.memory.recompute, ("full", "selective-op"))   # both rerun the block's collectives
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
    (forward), and keys, values and their gradients in backward (3× the forward's bytes); the ring overlaps this
    with the attention products, so only what exceeds them shows, plus each step's latency (Liu et al. 2023)."""
    m, cp = job.model, np.asarray(job.parallel.cp)
    elem = job.precision.plan.compute_bytes
    kv_bytes = 2 * micro_tokens / cp * m.kv_heads_ * m.head_dim_ / np.asarray(job.parallel.tp) * elem
    ring_s = 3 * (cp - 1) * kv_bytes / (bw * a.link_efficiency)
    return np.where(cp > 1, np.maximum(ring_s - attention_s, 0.0) + 3 * (cp - 1) * a.latency_intra_s, 0.0)


def backends(job: Job):
    """(megatron, deepspeed, torch) over a layout grid: which program each layout follows (Job.backend)."""
    par = job.parallel
    if par.backend is not None:
        megatron, deepspeed = np.asarray(par.backend == "megatron"), np.asarray(par.backend == "deepspeed")
    else:
        megatron, deepspeed = backend_masks(job.precision.mode, par.zero, par.tp, par.pp)
    return megatron, deepspeed, ~megatron & ~deepspeed


def is_megatron(job: Job):
    """Job.backend == "megatron", for layouts whose tp and pp may be arrays (the planner's grid)."""
    return backends(job)[0]


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


def data_parallel_s(job: Job, hw, a, trainable, n, bw, accum, micro_s, units):
    """(all, exposed) seconds of gradient reduction and parameter gathers over n replicas, as each backend runs
    them: DDP all-reduces once a step (no_sync while accumulating), Megatron (its distributed optimizer keeps a
    whole fp32 gradient buffer) and ZeRO-1 reduce(-scatter) once a step; ZeRO-2/3 of FSDP2 and DeepSpeed
    reduce-scatter every micro-batch, as sharded gradients cannot accumulate whole. ZeRO-3 gathers in every micro-batch's forward and backward, FSDP2's ZeRO-2 in its forward; ZeRO-1,
    DeepSpeed's ZeRO-2 and Megatron's distributed optimizer gather the updated shards once after the step
    (torch's ZeRO-1 broadcasts them). FSDP2 under a pipeline schedule gathers each block once a step (its first
    forward) and reduce-scatters once, after the stage's last backward, with nothing left to hide behind.
    Overlapped, a collective hides bucket by bucket (a gather: block by block) behind its micro-batch's backward
    (a gather: its compute; after the step: the next forward); the last bucket always shows."""
    zero = np.asarray(job.parallel.zero)
    megatron, deepspeed, torch_ = backends(job)
    ov = overlap_settings(job)
    if not a.comm_overlaps_compute:
        ov = {k: np.asarray(False) for k in ov}
    weight_b, grad_b, _o = bytes_per_param(job)
    gather_b = np.where(torch_ & (zero >= 2) & (job.precision.plan.family == "amp"), 2, weight_b)  # FSDP2's bf16
    if job.precision.fp8_all_gather and job.model.has_shape:     # the blocks' linear weights go as float8
        linear = job.model.layers * linear_params_per_layer(job.model) / count_params(job.model).total
        gather_b = gather_b * (1 - linear) + 1.0 * linear
    g = hw.gpus_per_node
    latency = latency_s(n, np.maximum(g // np.asarray(job.parallel.tp), 1), a)
    if a.fsdp_collective_s is not None:          # measured as FSDP2 issues a block's collectives (calibrate)
        latency = np.where(torch_ & (zero >= 2), a.fsdp_collective_s, latency)
    grad_bytes = trainable * grad_b
    # DDP and DeepSpeed reduce in buckets of bucket_bytes; FSDP2 reduce-scatters each wrapped block on its own
    buckets = np.where(torch_ & (zero >= 2), units, np.maximum(np.ceil(grad_bytes / a.bucket_bytes), 1))
    scatters = ~((zero == 0) | (torch_ & (zero == 1)))          # the rest all-reduce (2x the bytes)
    reduce_bw = np.where(scatters & (a.reduce_scatter_bw_bytes_per_s is not None),
                         a.reduce_scatter_bw_bytes_per_s or 1.0, bw)
    reduce_s = ring_s(np.where(scatters, 1.0, 2.0), grad_bytes, n, reduce_bw, a) \
        + buckets * latency
    # sharded gradients cannot accumulate whole; Megatron's distributed optimizer accumulates in a full fp32
    # buffer and reduce-scatters once (its "ZeRO-2" shards only what the step keeps)
    piped = pipelined_fsdp(job)
    reduce_events = np.where((zero >= 2) & ~megatron & ~piped, accum, 1)
    hidden = np.maximum(reduce_s - micro_s * 2 / 3 * (1 - 1 / buckets), reduce_s / buckets)
    reduce_exposed = reduce_events * np.where(ov["grad_reduce"] & ~piped, hidden, reduce_s)

    gather_s = ring_s(1.0, trainable * gather_b, n, a.gather_bw_bytes_per_s or bw, a) + units * latency
    per_micro = np.where(piped, 0, np.where(zero == 3, 2, np.where((zero == 2) & torch_, 1, 0)))  # sharded: every
    micro_gathers = per_micro * gather_s                  # one micro-batch's gathers                    # forward
    micro_exposed = np.where(ov["param_gather"], np.maximum(micro_gathers - micro_s * (1 - 1 / units),
                                                            micro_gathers / units), micro_gathers)
    after_step = (zero >= 1) & (per_micro == 0) & ~piped
    ahead = ov["param_gather"] & ~(torch_ & (zero == 1))  # ZeroRedundancyOptimizer's broadcast never hides
    after_exposed = np.where(ahead, np.maximum(gather_s - micro_s / 3 * (1 - 1 / units), gather_s / units), gather_s)
    once = np.where(piped, gather_s, 0.0)                 # pipelines: the first forward's, block by block
    once_exposed = np.where(ov["param_gather"], np.maximum(once - micro_s * (1 - 1 / units), once / units), once)
    total = reduce_events * reduce_s + accum * micro_gathers + np.where(after_step, gather_s, 0.0) + once
    exposed = reduce_exposed + accum * micro_exposed + np.where(after_step, after_exposed, 0.0) + once_exposed
    # over one rank FSDP2 still runs each collective's copies and hooks (fsdp_collective_s, when calibrated)
    paid = (np.asarray(n) > 1) | (torch_ & (zero >= 2))
    return np.where(paid, total, 0.0), np.where(paid, exposed, 0.0)
