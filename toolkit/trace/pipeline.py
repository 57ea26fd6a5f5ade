"""Measure pipeline-parallel memory on real gloo ranks: torch's pipelining schedules (1F1B, GPipe, interleaved
1F1B), one process per stage (per stage and tp rank under tensor parallelism), with the runner's stages, DTensor
plan and schedule (toolkit.program.pipeline, toolkit.program.parallel).

torch.distributed.pipelining does not run on fake tensors (its start-up vote reads a tensor's
value), so each stage runs for real, on the CPU: the runner's program as it builds it, and its step. Every rank
measures its own two steps with MemTracker, as the fake-tensor tracer does, and the busiest stage is reported.
Real memory limits this to small models (see MAX_PIPELINE_TRACE_BYTES).
"""

from __future__ import annotations

import dataclasses

import torch

from ..capability import check_traceable
from ..estimate.memory import memory_estimate
from ..program.compat import require_internals
from ..program.instrument import StageTracker, offloaded_shard_bytes, snapshot
from ..program.precision import torch_precision
from ..specs.errors import SpecError
from ..specs.job import Job
from .ranks import trace_on_ranks
from .result import TraceResult
from .steps import TraceHooks, two_steps

__all__ = ["trace_pipeline", "trace_pipeline_stages", "MAX_PIPELINE_TRACE_BYTES", "MAX_PIPELINE_MICRO_BATCHES"]

MAX_PIPELINE_TRACE_BYTES = 4 * 2**30
"""The estimated peak of all stages together must fit in this much real memory."""
MAX_PIPELINE_MICRO_BATCHES = 32


def check_pipeline_traceable(job: Job, estimated_total_bytes: float) -> None:
    """The capability rules of the pipeline tracer (toolkit.capability), then what this machine's real memory and
    the trace's length allow."""
    check_traceable(job)
    par, m = job.parallel, job.grad_accum or 1
    if m > MAX_PIPELINE_MICRO_BATCHES:
        raise SpecError(
            "batch.global_batch",
            job.batch.global_batch,
            f"{m} micro-batches per step; the pipeline trace runs at most {MAX_PIPELINE_MICRO_BATCHES} "
            "(set global_batch = micro_batch × dp × m with a smaller m)",
        )
    if estimated_total_bytes > MAX_PIPELINE_TRACE_BYTES:
        raise SpecError(
            "model",
            job.model.name,
            f"a pipeline trace allocates real memory ({estimated_total_bytes / 2**30:.1f} GiB over "
            f"{par.pp} stages, more than {MAX_PIPELINE_TRACE_BYTES / 2**30:.0f} GiB): trace fewer layers "
            "or a narrower model",
        )


def trace_pipeline(job: Job) -> TraceResult:
    """Run two steps of the job's pipeline schedule on pp real gloo ranks; the busiest stage's memory."""
    stages = trace_pipeline_stages(job)
    busiest = max(stages, key=lambda s: s.peak_bytes)
    return dataclasses.replace(busiest, stage_peaks_bytes=tuple(s.peak_bytes for s in stages))


def trace_pipeline_stages(job: Job) -> list[TraceResult]:
    """Every stage's memory, first to last: under tensor parallelism its busiest tp rank's. (The estimate only
    sizes the run: it refuses ones too large.)"""
    require_internals("the trace")
    par = job.parallel
    per_stage = par.tp * _dp_traced(job)
    check_pipeline_traceable(job, float(memory_estimate(job).peak_bytes) * par.pp * per_stage)
    ranks = trace_on_ranks(
        _trace_stage,
        job,
        par.pp * per_stage,
        "pipeline",
        "stage" if per_stage == 1 else "rank",
        "trace fewer layers, a narrower model or fewer micro-batches",
    )
    return [
        max(ranks[stage * per_stage : (stage + 1) * per_stage], key=lambda r: r.peak_bytes) for stage in range(par.pp)
    ]


def _dp_traced(job: Job) -> int:
    """Data-parallel ranks the trace runs: ZeRO shards over all of them (FSDP2 stages, or ZeRO-1's optimizer), and
    expert parallelism's ranks hold different experts and swap tokens; replicas are alike, one is run."""
    return job.parallel.dp if job.parallel.zero >= 1 or job.parallel.ep > 1 else 1


def _trace_stage(job: Job, rank: int, world: int) -> TraceResult:  # noqa: ARG001 - trace_on_ranks' signature
    """One rank's two steps of the runner's own pipeline program (toolkit.program.build: its stages, DTensor plan,
    FSDP2 or ZeroRedundancyOptimizer over dp, schedule and optimizer) and step (toolkit.program.step), over the
    traced dp ranks: its stage, or under interleaving (vpp > 1) its chunks rank, rank + pp, ...; under tensor
    parallelism its shard of them."""
    from ..program.build import build_pipeline
    from ..program.mesh import device_mesh

    par, dp = job.parallel, _dp_traced(job)
    batch = dataclasses.replace(job.batch, global_batch=job.batch.micro_batch * dp * job.grad_accum)  # (same m)
    traced = job.replace(
        parallel=dataclasses.replace(par, dp=dp),
        batch=batch,
        training=dataclasses.replace(job.training, init_from=None),
    )
    prog = build_pipeline(traced, torch_precision(job.precision.mode), torch.device("cpu"), device_mesh(traced, "cpu"))
    tracker = StageTracker()
    tracker.track_external(prog.raw, prog.optimizer)
    offload = par.offload != "none"  # FSDP2's: the shards, their gradients and states live on the host
    if offload:
        tracker.host_bytes = lambda _snap: offloaded_shard_bytes(prog.params, prog.optimizer)
    hooks = TraceHooks(tracker)
    with tracker:
        two_steps(prog, traced, tracker, hooks)
        after = snapshot(tracker, "current")
    peak = snapshot(tracker, "peak")
    tp_mesh = prog.tp_mesh
    on_device = 0 if offload else 1
    return TraceResult(
        params_bytes=on_device * after.get("PARAM", 0) + after.get("BUFFER", 0),
        grads_bytes=on_device * hooks.snaps["before_step"].get("GRAD", 0),
        optimizer_bytes=on_device * (after.get("OPT", 0) + after.get("OTH", 0)),
        activations_bytes=0,  # no single forward/backward boundary: micro-batches interleave
        host_bytes=hooks.snaps.get("host_bytes", 0),
        peak_bytes=peak.get("Device" if offload else "Total", 0),
        peak_breakdown=peak,
        boundary_breakdown={},
        program=f"cpu, {'interleaved ' if par.vpp > 1 else ''}{par.schedule} stage {prog.pp_rank} of {par.pp}"
        + (f", tp rank {tp_mesh.get_local_rank()} of {tp_mesh.size()}" if tp_mesh is not None else ""),
    )
