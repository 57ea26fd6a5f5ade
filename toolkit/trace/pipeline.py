"""Measure pipeline-parallel memory on real gloo ranks: torch's pipelining schedules (1F1B, GPipe, interleaved
1F1B), one process per stage, with the runner's stages and schedule (toolkit.train.pipeline).

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
    if par.tp > 1 or par.zero > 0 or par.offload != "none":
        raise SpecError("parallel", f"pp={par.pp} tp={par.tp} zero={par.zero}",
                        "pipelines are traced alone (tp 1, zero 0, no offload) so far")
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
    """Every stage's memory, first to last. (The estimate only sizes the run: it refuses ones too large.)"""
    require_internals("the trace")
    check_pipeline_traceable(job, float(memory_estimate(job).peak_bytes) * job.parallel.pp)
    return trace_on_ranks(_trace_stage, job, job.parallel.pp, "pipeline", "stage",
                          "trace fewer layers, a narrower model or fewer micro-batches")


def _trace_stage(job: Job, rank: int, stages: int) -> TraceResult:
    """One rank's step: its stage, or under interleaving (vpp > 1) its chunks rank, rank + pp, ..."""
    from ..train.model import GPT
    from ..train.pipeline import build_schedule, split_stages

    mode, m, vpp = job.precision.mode, job.grad_accum or 1, job.parallel.vpp
    spec, b, seq = job.model, job.batch.micro_batch, job.model.seq_len
    weights_dtype = TORCH_DTYPES[job.precision.plan.weights]      # (mixed-* is refused above)
    with torch.device("meta"):
        model = GPT(spec, attention=job.memory.attention, recompute=job.memory.recompute, dtype=weights_dtype)
        stage_module = split_stages(model, job, rank)
    stage_module.to_empty(device="cpu")                  # uninitialised: only the bytes matter
    del model
    schedule = build_schedule(stage_module, job, torch.device("cpu"))   # the runner's stages and schedule
    optimizer = _make_optimizer(job, stage_module.parameters())
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
                if rank == 0:
                    schedule.step(torch.randint(0, spec.vocab, (b * m, seq)))
                elif rank == stages - 1:
                    schedule.step(target=torch.randint(0, spec.vocab, (b * m, seq)), return_outputs=False)
                else:
                    schedule.step()
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
        program=f"cpu, {'interleaved ' if vpp > 1 else ''}{job.parallel.schedule} stage {rank} of {stages}",
    )
