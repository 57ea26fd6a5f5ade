"""Measure pipeline-parallel memory on real gloo ranks: torch's pipelining schedules (1F1B, GPipe, interleaved
1F1B), one process per stage (per stage and tp rank under tensor parallelism), with the runner's stages, DTensor
plan and schedule (toolkit.train.pipeline, toolkit.train.parallel).

torch.distributed.pipelining does not run on fake tensors (its start-up vote reads a tensor's
value), so each stage runs for real, on the CPU, with uninitialised weights: the values do
not matter, the bytes do. Every rank measures its own step with MemTracker, as the fake-tensor
tracer does, and the busiest stage is reported. Real memory limits this to small models
(see MAX_PIPELINE_TRACE_BYTES).
"""
from __future__ import annotations

import dataclasses

import torch

from ..estimate.memory import memory_estimate
from ..specs.errors import SpecError
from ..compat import require_internals
from ..specs.job import TORCH_SEMANTICS, Job
from .memory import StageTracker, TraceResult, _make_optimizer, _snapshot
from ..train.precision import TORCH_DTYPES, torch_precision
from .ranks import trace_on_ranks

__all__ = ["trace_pipeline", "trace_pipeline_stages", "MAX_PIPELINE_TRACE_BYTES", "MAX_PIPELINE_MICRO_BATCHES"]

MAX_PIPELINE_TRACE_BYTES = 4 * 2**30
"""The estimated peak of all stages together must fit in this much real memory."""
MAX_PIPELINE_MICRO_BATCHES = 32


def check_pipeline_traceable(job: Job, estimated_total_bytes: float) -> None:
    par, m = job.parallel, job.grad_accum or 1
    if par.offload != "none":
        raise SpecError("parallel.offload", par.offload, "pipelines are traced without offload so far")
    if par.vpp > 1 and par.schedule == "gpipe":
        raise SpecError("parallel.schedule", par.schedule, "interleaved stages (vpp > 1) run the interleaved 1F1B "
                                                           "schedule; set schedule: 1f1b or vpp: 1")
    if job.precision.mode not in TORCH_SEMANTICS:
        raise SpecError("precision.mode", job.precision.mode, "mixed-* modes follow Megatron's pipeline program, "
                                                              "which the tracer does not run; trace pipelines with "
                                                              "fp32, amp-* or pure-bf16 (torch's schedules)")
    if job.finetune.method != "full" or job.memory.act_compress != "none" or job.optimizer.name == "adamw-8bit":
        raise SpecError("finetune.method", job.finetune.method, "pipelines are traced with full fine-tuning, "
                                                                "no activation compression, no 8-bit optimizer")
    if m > MAX_PIPELINE_MICRO_BATCHES:
        raise SpecError("batch.global_batch", job.batch.global_batch,
                        f"{m} micro-batches per step; the pipeline trace runs at most {MAX_PIPELINE_MICRO_BATCHES} "
                        "(set global_batch = micro_batch × dp × m with a smaller m)")
    if estimated_total_bytes > MAX_PIPELINE_TRACE_BYTES:
        raise SpecError("model", job.model.name,
                        f"a pipeline trace allocates real memory ({estimated_total_bytes / 2**30:.1f} GiB over "
                        f"{par.pp} stages, more than {MAX_PIPELINE_TRACE_BYTES / 2**30:.0f} GiB): trace fewer layers "
                        "or a narrower model")


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
    ranks = trace_on_ranks(_trace_stage, job, par.pp * per_stage, "pipeline", "stage" if per_stage == 1 else "rank",
                           "trace fewer layers, a narrower model or fewer micro-batches")
    return [max(ranks[stage * per_stage:(stage + 1) * per_stage], key=lambda r: r.peak_bytes)
            for stage in range(par.pp)]


def _dp_traced(job: Job) -> int:
    """Data-parallel ranks the trace runs: ZeRO shards over all of them (FSDP2 stages, or ZeRO-1's optimizer);
    replicas are alike, one is run."""
    return job.parallel.dp if job.parallel.zero >= 1 else 1


def _stage_modules(job: Job, rank: int):
    """(this rank's chunks, its pipeline group or None, its pipeline rank, the tp mesh or None, its dp group or
    None): one pipeline's
    ranks (the runner's mesh at dp 1; at ZeRO-2/3 every dp rank), the stages sharded by its DTensor plan when
    tp > 1 and by FSDP2 over dp, as the runner shards them (toolkit.train.program)."""
    from ..train.model import GPT
    from ..train.parallel import tensor_parallel
    from ..train.parallelize import apply_fsdp, device_mesh
    from ..train.pipeline import split_stages
    par = job.parallel
    dp = _dp_traced(job)
    mesh = device_mesh(job.replace(parallel=dataclasses.replace(par, dp=dp)), "cpu") if par.tp * dp > 1 else None
    pp_rank = mesh["pp"].get_local_rank() if mesh is not None else rank
    with torch.device("meta"):
        model = GPT(job.model, attention=job.memory.attention, recompute=job.memory.recompute,
                    dtype=TORCH_DTYPES[job.precision.plan.weights])         # (mixed-* is refused above)
        stage_module = split_stages(model, job, pp_rank)
    stage_module.to_empty(device="cpu")                  # uninitialised: only the bytes matter
    if mesh is None:
        return stage_module, None, pp_rank, None, None
    for stage in stage_module:
        if par.tp > 1:
            tensor_parallel(stage, mesh["tp"], sequence_parallel=par.sp, local_logits=True)
        if dp > 1 and par.zero >= 2:
            apply_fsdp(stage, job, mesh["dp"], pin_memory=False)
    return (stage_module, mesh["pp"].get_group(), pp_rank, mesh["tp"] if par.tp > 1 else None,
            mesh["dp"].get_group() if dp > 1 else None)


def _trace_stage(job: Job, rank: int, world: int) -> TraceResult:
    """One rank's step: its stage, or under interleaving (vpp > 1) its chunks rank, rank + pp, ...; under tensor
    parallelism its shard of them."""
    from ..train.pipeline import build_schedule, run_schedule

    mode, m, vpp = job.precision.mode, job.grad_accum or 1, job.parallel.vpp
    spec, b, seq = job.model, job.batch.micro_batch, job.model.seq_len
    stage_module, group, pp_rank, tp_mesh, dp_group = _stage_modules(job, rank)
    stages = job.parallel.pp
    schedule = build_schedule(stage_module, job, torch.device("cpu"), group, tp_mesh=tp_mesh)   # the runner's
    optimizer = _make_optimizer(job, stage_module.parameters(), group=dp_group)
    autocast = torch_precision(mode).autocast("cpu")
    tracker = StageTracker()
    tracker.track_external(stage_module, optimizer)
    snaps = {}
    with tracker:
        for step in range(2):
            if step == 1:   # the steady step's peak only
                tracker.reset_peak()
            tracker.reset_mod_stats()
            with autocast:
                run_schedule(schedule, job, pp_rank, torch.randint(0, spec.vocab, (b * m, seq)),
                             torch.randint(0, spec.vocab, (b * m, seq)))
            snaps["before_step"] = _snapshot(tracker, "current")
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        snaps["after"] = _snapshot(tracker, "current")
    snaps["peak"] = _snapshot(tracker, "peak")
    after = snaps["after"]
    return TraceResult(
        params_bytes=after.get("PARAM", 0) + after.get("BUFFER", 0),
        grads_bytes=snaps["before_step"].get("GRAD", 0),
        optimizer_bytes=after.get("OPT", 0) + after.get("OTH", 0),
        activations_bytes=0,                 # no single forward/backward boundary: micro-batches interleave
        peak_bytes=snaps["peak"].get("Total", 0),
        peak_breakdown=snaps["peak"],
        boundary_breakdown={},
        program=f"cpu, {'interleaved ' if vpp > 1 else ''}{job.parallel.schedule} stage {pp_rank} of {stages}"
                + (f", tp rank {tp_mesh.get_local_rank()} of {tp_mesh.size()}" if tp_mesh is not None else ""),
    )
