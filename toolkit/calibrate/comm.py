"""Collectives, measured on the process group with every rank busy: all-reduce latency and bandwidth,
reduce-scatter and all-gather bandwidth, and the collectives of tensor parallelism and FSDP2 as the runner's
program issues them in the job's blocks. toolkit.calibrate runs these on every rank at once."""

from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np
import torch
import torch.distributed as dist

from ..program.mesh import build_mesh
from ..specs.dims import ParallelDims
from ..specs.job import Job
from .kernels import block_run, rank_spec

__all__ = ["collective_fit", "sharded_bw_bytes_per_s", "tp_collective_s", "fsdp_collective_s"]

COLLECTIVE_BYTES = tuple(4096 * 4**k for k in range(7))  # 4 KiB ... 16 MiB
COLLECTIVE_REPEATS = 9
FSDP_BLOCKS = 4
"""Blocks FSDP2's collectives are timed over (fewer when the job has fewer)."""


def collective_fit(world: int) -> tuple[float | None, float | None]:
    """(bus bandwidth bytes/s, latency s per ring step) of all-reduce over the group: t = 2(n−1)·latency +
    2(n−1)/n·bytes / bandwidth, fitted over sizes from 4 KiB to 16 MiB to each size's mean time (a step pays the
    mean: on a busy CPU a collective now and then waits a scheduler tick for its peer's thread) with every
    size weighed by its relative error, so that the small sizes fix the latency and the large the bandwidth."""
    if world == 1:
        return None, None
    sizes, times = [], []
    for nbytes in COLLECTIVE_BYTES:  # a fixed count: every rank must call as often as the others
        buffer = torch.zeros(nbytes // 4)
        dist.all_reduce(buffer)
        repeats = COLLECTIVE_REPEATS * max(1, 2**20 // nbytes) if nbytes < 2**20 else COLLECTIVE_REPEATS
        start = time.perf_counter()
        for _ in range(min(repeats, 200)):
            dist.all_reduce(buffer)
        times.append((time.perf_counter() - start) / min(repeats, 200))
        sizes.append(2 * (world - 1) / world * nbytes)
    t = np.array(times)
    slope, intercept = np.polyfit(np.array(sizes), t, 1, w=1 / t)
    times_all = torch.tensor([1 / slope if slope > 0 else 0.0, max(intercept, 0.0) / (2 * (world - 1))])
    dist.all_reduce(times_all, op=dist.ReduceOp.MIN)  # every rank reports the group's figure
    return float(times_all[0]) or None, float(times_all[1])


def sharded_bw_bytes_per_s(world: int, nbytes: int = 16 * 2**20, repeats: int = 9) -> tuple[float | None, float | None]:
    """(reduce-scatter, all-gather) bus bandwidth over the group, bytes/s: (n−1)/n·bytes over each one's mean time at
    16 MiB, where latency no longer counts. ZeRO-2/3 run these; gloo's reduce-scatter is far slower than its
    all-reduce's bandwidth suggests (it copies its whole input, then reduces), NCCL's is not."""
    if world == 1:
        return None, None
    whole, shard = torch.zeros(nbytes // 4), torch.zeros(nbytes // 4 // world)
    rates = []
    for run in (lambda: dist.reduce_scatter_tensor(shard, whole), lambda: dist.all_gather_into_tensor(whole, shard)):
        run()
        start = time.perf_counter()
        for _ in range(repeats):
            run()
        rates.append((world - 1) / world * nbytes / ((time.perf_counter() - start) / repeats))
    agreed = torch.tensor(rates)
    dist.all_reduce(agreed, op=dist.ReduceOp.MIN)
    return float(agreed[0]), float(agreed[1])


def _extra_s(layout, local, run, seconds: float) -> float:
    """Seconds `run(layout)` takes beyond `run(local)`: timed in turns (3 calls of each) for about `seconds` while
    the other ranks do the same (they agree when to stop, so all call as often); the median turn's difference per
    call, the group's maximum. A turn's two halves see the same moments of a shared machine and the median drops
    the turns another process cut into (a mean of the totals read 0 under a parallel test run's load)."""
    for module in (layout, local):
        run(module)
    turns_s, start = [], time.perf_counter()
    while True:
        spent = []
        for module in (layout, local):
            began = time.perf_counter()
            for _ in range(3):
                run(module)
            spent.append(time.perf_counter() - began)
        turns_s.append((spent[0] - spent[1]) / 3)
        done = torch.tensor([float(time.perf_counter() - start > seconds)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)
        if done.item():
            break
    extra = torch.tensor([statistics.median(turns_s)])
    dist.all_reduce(extra, op=dist.ReduceOp.MAX)
    return float(extra)


def tp_collective_s(
    job: Job, world: int, dtype: torch.dtype, bus_bw_bytes_per_s: float | None, seconds: float = 2.0
) -> float | None:
    """Seconds of one tensor-parallel collective's fixed cost as the runner's program issues it, beyond moving its
    bytes: one of the job's blocks under the runner's own DTensor plan (toolkit.program.parallel.block_plan, the
    job's tp group and sequence parallelism), forward and backward, against a block of this rank's share (heads
    and MLP width over tp) without parallelism, in turns; the difference, over the block's collectives
    (toolkit.estimate.comm.tp_collectives_per_block), is each collective with the DTensor dispatch and
    redistribution around it. Measured at the job's shapes because on a shared CPU the wait for the peer grows
    with the work between collectives. None without tensor parallelism."""
    tp = job.parallel.tp
    if tp <= 1 or world % tp:
        return None
    from torch.distributed.tensor.parallel import parallelize_module

    from ..estimate.comm import tp_collectives_per_block
    from ..program.parallel import block_plan

    m, sp = job.model, job.parallel.sp
    mesh = build_mesh(ParallelDims(dp=world // tp, tp=tp), "cpu")["tp"]
    run, build = block_run(job, m.seq_len // tp if sp else m.seq_len)
    local_run, _ = block_run(job, m.seq_len)
    torch.manual_seed(0)
    whole = build(m)
    parallelize_module(whole, mesh, block_plan(whole, sp))
    share = build(rank_spec(job))  # this rank's heads and MLP width
    extra = _extra_s(whole, share, lambda b: (run if b is whole else local_run)(b), seconds)
    collectives = float(tp_collectives_per_block(job))
    activation_bytes = job.batch.micro_batch * m.seq_len * m.hidden * torch.finfo(dtype).bits // 8
    moving_s = 2 * (tp - 1) / tp * activation_bytes / bus_bw_bytes_per_s if bus_bw_bytes_per_s else 0.0
    return max(extra / collectives - moving_s, 0.0)


class _Blocks(torch.nn.Module):
    """A few blocks in a row under a parameterless root: FSDP2's root unit over inner block units, as in the
    model (with several, each block's gather overlaps the one before it as the program's prefetch does)."""

    def __init__(self, blocks: list[torch.nn.Module]):
        super().__init__()
        self.blocks = torch.nn.ModuleList(blocks)

    def forward(self, x, cos=None, sin=None):
        for block in self.blocks:
            x = block(x, cos, sin)
        return x


def fsdp_collective_s(
    job: Job, world: int, reduce_scatter_bw: float | None, gather_bw: float | None, seconds: float = 1.0
) -> float | None:
    """Seconds of one FSDP2 collective's cost beyond its ring bytes, as the runner's program issues it: up to
    FSDP_BLOCKS of the job's blocks sharded as toolkit.program.parallelize.apply_fsdp shards them (its dp group,
    mixed-precision policy and resharding) under an empty root, forward and backward, against the same blocks
    whole, in turns; the difference per block, less its bytes at the measured gather and reduce-scatter
    bandwidths, over a block's collectives in a micro-batch (a gather, a second one in backward at ZeRO-3, a reduce-scatter). On a CPU this is far
    above the all-reduce's latency: fresh buffers for every gather and reduction (their pages are first touched
    then), the copies in and out of them, the hooks, and the wait for the peer's thread. Over one replica FSDP2
    moves nothing but still copies each shard out and each gradient through its reduce-scatter buffers, under
    the same hooks (on the README's small GPT here, a ZeRO-3 step costs 1.5x the plain one): measured on a
    one-rank group. None unless the job runs FSDP2."""
    from torch.distributed.fsdp import fully_shard

    from ..estimate.states import bytes_per_param
    from ..program.mesh import join_one_process_group, leave_one_process_group
    from ..program.parallelize import fsdp_policies

    par = job.parallel
    if not ParallelDims.from_job(job).fsdp or world % (par.tp * par.pp * par.cp):
        return None
    dims = ParallelDims.for_world(job.replace(parallel=dataclasses.replace(par, dp=None)), world)
    dp = dims.dp
    if world == 1 and not dist.is_initialized():  # (calibrate's one rank runs in its own process)
        join_one_process_group("cpu")
        try:
            return fsdp_collective_s(job, world, reduce_scatter_bw, gather_bw, seconds)
        finally:
            leave_one_process_group()
    mesh = build_mesh(dims, "cpu")["dp"]
    run, build = block_run(job, job.model.seq_len)
    torch.manual_seed(0)
    count = min(job.model.layers, FSDP_BLOCKS)
    sharded = _Blocks([build(job.model) for _ in range(count)])
    whole = _Blocks([build(job.model) for _ in range(count)])
    precision, _ = fsdp_policies(job, pin_memory=False)
    reshard = par.zero == 3 and par.pp == 1
    for module in (*sharded.blocks, sharded):
        fully_shard(module, mesh=mesh, reshard_after_forward=reshard, mp_policy=precision)
    extra = _extra_s(sharded, whole, run, seconds) / count
    params = sum(p.numel() for p in whole.blocks[0].parameters())
    weight_b, grad_b, _ = bytes_per_param(job)
    gather_b = 2 if job.precision.plan.family == "amp" else weight_b  # FSDP2 gathers amp's 16-bit copies
    gathers = 2 if reshard else 1
    ring = (dp - 1) / dp * params
    moving_s = gathers * ring * gather_b / (gather_bw or float("inf")) + ring * grad_b / (
        reduce_scatter_bw or float("inf")
    )
    return max((extra - moving_s) / (gathers + 1), 0.0)
