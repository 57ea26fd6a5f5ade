"""A Mixture of Experts' communication in one step: the dispatch and combine of each block as the job's dispatcher
moves them, and expert tensor parallelism's gathers, for toolkit.estimate.steptime.

    ep_block_s = all_to_all_per_block_s(job, hw, a, tokens)   # one block, one micro-batch
"""

from __future__ import annotations

import numpy as np

from ..specs.job import Job
from .collectives import bus_bw_bytes_per_s, latency_s, ring_s
from .hardware import Assumptions, Hardware
from .moe import FP8_DISPATCH_BYTES, all_to_all_s, allgather_dispatch_s, deepep_s, expert_grid, expert_load

__all__ = ["all_to_all_per_block_s", "exposed_ep_s", "OVERLAP_SM_SHARE"]

OVERLAP_SM_SHARE = 24 / 132
"""The share of a GPU's SMs the dispatch and combine kernels hold while they overlap compute: DeepEP's normal
kernels default to 24 SMs (`Buffer.set_num_sms`, its README) of an H100's 132; assumed the same share on other parts
and for NCCL's all-to-all, whose channels also run on SMs."""


def all_to_all_per_block_s(job: Job, hw: Hardware, a: Assumptions, tokens):
    """Expert parallelism's all-to-alls of one block (the mean over blocks, the dense ones included), one
    micro-batch: dispatch and combine forward, and both again for their gradients (and once more where recompute
    reruns the forward), each of this rank's tokens · k hidden vectors in the compute dtype at the busiest rank's
    load, over the ep ranks where the expert grid puts them (tp · cp apart inside dp; etp apart on a folded grid, each
    rank sending its tensor-parallel share). Not overlapped with compute (the
    runner's program, and Megatron's default)."""
    m = job.model
    if not m.has_shape or not m.experts:
        return 0.0
    grid = expert_grid(job)
    sent = tokens / grid.token_split
    size = sent * m.experts_per_token * m.hidden * job.precision.plan.compute_bytes * expert_load(m, job.parallel.ep)
    again = np.isin(job.memory.recompute, ("full", "selective-op"))
    count = 4 + 2 * again
    etp = np.asarray(job.parallel.etp)
    # expert tensor parallelism: the etp ranks (neighbours) gather what arrived before their slice of each expert
    # runs and reduce-scatter its output, forward and again for the gradients
    gathers_s = ring_s(1.0, size * etp, etp, bus_bw_bytes_per_s(etp, 1, hw, a)) + latency_s(etp, 1, hw.gpus_per_node, a)
    etp_s = np.where(etp > 1, count * gathers_s, 0.0)
    return (_dispatch_combine_s(job, hw, a, sent, size, count) + etp_s) * m.moe_layers / m.layers


def _dispatch_combine_s(job: Job, hw: Hardware, a: Assumptions, sent, size, count):
    """`count` dispatches and combines of one block (half of each kind) as the job's dispatcher moves them: NCCL's
    all-to-all, DeepEP's node-deduplicated kernels (the dispatches in FP8 where asked: forward, and the gradient's
    before the down projections, DeepSeek-V3 §3.3), or Megatron's allgather and reduce-scatter."""
    m, grid, ep = job.model, expert_grid(job), job.parallel.ep
    dispatcher = np.asarray(job.moe.dispatcher)  # one name, or one a layout when a search tries each
    names = set(np.unique(dispatcher).tolist())

    def allgather():
        token_bytes = sent * m.hidden * job.precision.plan.compute_bytes
        return count * allgather_dispatch_s(token_bytes, ep, grid.stride, hw, a)

    def deepep():
        fp8 = job.precision.fp8 if job.moe.fp8_dispatch is None else job.moe.fp8_dispatch
        dispatch_size = size * (FP8_DISPATCH_BYTES / job.precision.plan.compute_bytes if fp8 else 1.0)
        return (
            count / 2 * (deepep_s(dispatch_size, ep, grid.stride, hw, a, m) + deepep_s(size, ep, grid.stride, hw, a, m))
        )

    def alltoall():
        return count * all_to_all_s(size, ep, grid.stride, hw, a)

    priced = {"allgather": allgather, "deepep": deepep, "flex": deepep}
    if len(names) == 1:  # the usual case: price only the dispatcher the job names
        return priced.get(names.pop(), alltoall)()
    return np.select(
        [dispatcher == "allgather", np.isin(dispatcher, ("deepep", "flex"))],
        [allgather(), deepep()],
        default=alltoall(),
    )


def exposed_ep_s(ep_s, matmuls_s, job: Job, accum=1):
    """What shows of a micro-batch's dispatches and combines (`ep_s`) when Megatron-Core overlaps them with the
    adjacent micro-batch's compute (`--overlap-moe-expert-parallel-comm`, combined 1F1B): only micro-batches in the
    schedule's steady state have a neighbour to hide behind (not the warm-up and cool-down of an interleaved
    pipeline, Megatron's count: 2·(pp − 1) + (vpp − 1)·pp chunks, nor the first forward and last backward), what is
    hidden cannot exceed the compute, and the compute beside it runs on the SMs the communication leaves
    (OVERLAP_SM_SHARE)."""
    pp, vpp = np.asarray(job.parallel.pp), np.asarray(job.parallel.vpp)
    chunks = np.maximum(np.asarray(accum) * vpp, 1)
    warmup = np.where(pp > 1, 2 * (pp - 1) + (vpp - 1) * pp, 0) + 1
    steady = np.clip(1 - warmup / chunks, 0.0, 1.0)
    hidden = np.minimum(ep_s * steady, matmuls_s)
    return ep_s - hidden + hidden * OVERLAP_SM_SHARE / (1 - OVERLAP_SM_SHARE)
