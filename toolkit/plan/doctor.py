"""The doctor: what to change when a job does not fit or is slow, and what a finished run's metrics say.

    report = diagnose_job(job, catalog)      # fixes, each with the memory and step time it would give
    report = diagnose_run("runs/demo")       # overflow, divergence, data stalls, estimate vs measurement

Every fix is a real change to the Job (the same fields a user would set), estimated by the same
memory and step-time model as `toolkit estimate`; nothing here is a rule of thumb without a number.
Fixes that make the job fit come first, cheapest in step time first.
"""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import numpy as np

from ..estimate.device import device_memory
from ..estimate.hardware import hardware_for
from ..estimate.memory import memory_estimate
from ..estimate.steptime import step_time
from ..specs import Job, SpecError
from ..specs.catalog import Catalog

__all__ = ["diagnose_job", "diagnose_run", "candidate_changes"]


def _replace(job: Job, section: str, **changes) -> Job:
    return job.replace(**{section: dataclasses.replace(getattr(job, section), **changes)})


def candidate_changes(job: Job) -> list[tuple[str, Job]]:
    """(what, changed job) for every single change that can lower memory or time."""
    par, mem, out = job.parallel, job.memory, []
    if not mem.expandable_segments:
        out.append(
            (
                "expandable segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; less fragmentation)",
                _replace(job, "memory", expandable_segments=True),
            )
        )
    if mem.recompute != "selective":
        out.append(("selective recompute (attention core only)", _replace(job, "memory", recompute="selective")))
    if (
        mem.recompute not in ("selective-op", "full")
        and not job.finetune.adapters
        and mem.act_compress == "none"
        and job.backend == "torch"
    ):
        out.append(
            (
                "per-op selective recompute (keep every other matmul's output; torchtitan's policy)",
                _replace(job, "memory", recompute="selective-op"),
            )
        )
    if mem.recompute != "full":
        out.append(("full recompute (keep block inputs only)", _replace(job, "memory", recompute="full")))
    for zero in range(par.zero + 1, 4 if par.dp > 1 else par.zero + 1):  # dp = 1: nothing to shard over
        out.append((f"ZeRO-{zero} over the {par.dp} data-parallel ranks", _replace(job, "parallel", zero=zero)))
    if job.batch.micro_batch > 1:
        half = job.batch.micro_batch // 2
        out.append(
            (f"micro-batch {half} (more accumulation, same global batch)", _replace(job, "batch", micro_batch=half))
        )
    if job.batch.micro_batch * 2 * par.dp <= job.batch.global_batch:
        out.append(
            (
                f"micro-batch {job.batch.micro_batch * 2} (fewer, larger matmuls)",
                _replace(job, "batch", micro_batch=job.batch.micro_batch * 2),
            )
        )
    for tp in (par.tp * 2, par.tp * 4):
        if job.cluster.count % (tp * par.pp) == 0:
            out.append((f"tensor parallel {tp}", _replace(job, "parallel", tp=tp, dp=None)))
    if job.cluster.count % (par.tp * par.pp * 2) == 0:
        out.append((f"pipeline parallel {par.pp * 2}", _replace(job, "parallel", pp=par.pp * 2, dp=None)))
    if par.tp > 1 and not par.sp:
        out.append(("sequence parallelism", _replace(job, "parallel", sp=True)))
    if par.pp > 1 and par.vpp == 1:
        out.append(("interleaved pipeline (2 virtual stages)", _replace(job, "parallel", vpp=2)))
    if par.offload == "none":
        out.append(("offload optimizer states to the host", _replace(job, "parallel", offload="optimizer")))
        out.append(
            (
                "offload parameters, gradients and optimizer states",
                _replace(job, "parallel", offload="params", zero=max(par.zero, 3)),
            )
        )
    if job.optimizer.name in ("adam", "adamw"):
        out.append(("8-bit AdamW states", _replace(job, "optimizer", name="adamw-8bit")))
    return out + _expert_changes(job) + _finetune_changes(job)


def _expert_changes(job: Job) -> list[tuple[str, Job]]:
    """A Mixture of Experts: share the experts out over more ranks (ep), or bound each expert's tokens (a capacity
    factor, which drops the overflow), or route dropless where a capacity factor is set."""
    m, par, out = job.model, job.parallel, []
    if not m.has_shape or not m.experts:
        return out
    shard = par.dp // par.dp_replicate
    for ep in (par.ep * 2, par.ep * 4):
        if m.experts % ep == 0 and shard % ep == 0:
            out.append(
                (
                    f"expert parallel {ep} (each rank keeps {m.experts // ep} of the {m.experts} experts)",
                    _replace(job, "parallel", ep=ep),
                )
            )
    if m.capacity_factor is None:
        out.append(
            (
                "capacity factor 1.25 (each expert takes at most 1.25× an even share; the overflow is dropped)",
                _replace(job, "model", capacity_factor=1.25),
            )
        )
    else:
        out.append(
            ("dropless routing (no capacity factor: no token dropped)", _replace(job, "model", capacity_factor=None))
        )
    return out


def _finetune_changes(job: Job) -> list[tuple[str, Job]]:
    """A full fine-tune can train adapters instead (LoRA; QLoRA with the base in 4-bit NormalFloat), and a LoRA one
    can put its base in 4 bits (QLoRA); either can keep weights, gradients and states in bf16 (pure-bf16, a LoRA's
    frozen base in bf16 rather than fp32 masters): the toolkit models all of them, before any offloading."""
    if job.workload != "finetune" or job.finetune.method == "qlora":
        return []
    out = [("QLoRA (LoRA over a 4-bit NormalFloat base)", _replace(job, "finetune", method="qlora"))]
    if job.finetune.method == "full":
        out.insert(
            0, ("LoRA adapters (rank 8 on q, k, v, o; the base frozen)", _replace(job, "finetune", method="lora"))
        )
    if job.precision.mode != "pure-bf16" and job.precision.mode not in ("fp32", "amp-fp16", "mixed-fp16"):
        out.append(
            (
                "pure bf16 (weights, gradients and AdamW states in bf16)",
                _replace(job, "precision", mode="pure-bf16", grad_dtype="param"),
            )
        )
    return out


def _valid_changes(job: Job, catalog: Catalog):
    """(what, resolved job) for each candidate change that is valid for this job (e.g. not tp > heads)."""
    for what, changed in candidate_changes(job):
        try:
            yield what, changed.resolve(catalog)[0]
        except SpecError:
            continue


def _evaluate(job: Job, catalog: Catalog):
    """(device-visible peak, tensors' peak, step s, step breakdown): the device peak decides the fit."""
    mem = memory_estimate(job)
    held = device_memory(job, mem.peak_bytes, catalog.accelerator(job.cluster.accelerator))
    hw = hardware_for(job, catalog)
    st = step_time(job, hw) if hw is not None else None
    return float(held.device_bytes), float(mem.peak_bytes), (float(st.step_s) if st is not None else None), st


def diagnose_job(job: Job, catalog: Catalog) -> dict:
    """Fixes for a job that does not fit, and for the slowest parts of one that does."""
    job, _notes = job.resolve(catalog)
    if not job.cluster.accelerator:
        raise SpecError("--gpus", None, "the doctor needs the hardware: give --gpus COUNTxNAME or --offer")
    acc = catalog.accelerator(job.cluster.accelerator)
    usable = acc.memory_bytes * (1 - job.memory.headroom_fraction)
    peak, tensors, step_s, st = _evaluate(job, catalog)
    fits = peak <= usable
    fixes = []
    for what, changed in _valid_changes(job, catalog):
        new_peak, new_tensors, new_step, _ = _evaluate(changed, catalog)
        fixes.append(
            {
                "change": what,
                "job": changed.to_dict(),
                "device_peak_bytes": new_peak,
                "peak_bytes": new_tensors,
                "fits": new_peak <= usable,
                "step_s": new_step,
                "step_change": None if step_s is None or new_step is None else new_step / step_s - 1,
            }
        )
    combined = None
    if fits:  # a job that fits only wants what makes it faster
        fixes = [f for f in fixes if f["fits"] and f["step_change"] is not None and f["step_change"] < -0.01]
        fixes.sort(key=lambda f: f["step_change"])
    else:
        fixes.sort(
            key=lambda f: (
                not f["fits"],
                f["step_change"] if f["fits"] and f["step_change"] is not None else f["device_peak_bytes"],
            )
        )
        fragmented = [f for f in fixes if f["fits"] and f["change"].startswith("expandable segments")]
        if fragmented:  # fragmentation is what does not fit: the fix that costs no time goes first
            fixes.remove(fragmented[0])
            fixes.insert(0, fragmented[0])
        if not any(f["fits"] for f in fixes):
            combined = _combine(job, catalog, usable, step_s)
    findings = _findings(job, st, peak, usable)
    return {
        "job": job.to_dict(),
        "device_peak_bytes": peak,
        "peak_bytes": tensors,
        "usable_bytes": usable,
        "fits": fits,
        "step_s": step_s,
        "breakdown": {k: float(v) for k, v in st.breakdown().items()} if st is not None else None,
        "findings": findings,
        "fixes": fixes,
        "combined": combined,
    }


def _combine(job: Job, catalog: Catalog, usable: float, step_s: float | None, rounds: int = 5) -> dict | None:
    """No single change fits: apply, one after another, the change that frees the most memory per unit of
    added step time, until the job fits (or nothing helps). Returns the changes and where they end."""
    steps, current = [], job
    current_peak, _, current_step, _ = _evaluate(job, catalog)
    for _ in range(rounds):
        best = None
        for what, changed in _valid_changes(current, catalog):
            peak, _, step, _ = _evaluate(changed, catalog)
            freed = current_peak - peak
            if freed <= 0:
                continue
            cost = max((step or 0) - (current_step or 0), 1e-9)
            score = (peak <= usable, freed / cost)
            if best is None or score > best[0]:
                best = (score, what, changed, peak, step)
        if best is None:
            return None
        _score, what, current, current_peak, current_step = best
        steps.append(what)
        if current_peak <= usable:
            return {
                "changes": steps,
                "job": current.to_dict(),
                "device_peak_bytes": current_peak,
                "fits": True,
                "step_s": current_step,
                "step_change": None if step_s is None or current_step is None else current_step / step_s - 1,
            }
    return {
        "changes": steps,
        "job": current.to_dict(),
        "device_peak_bytes": current_peak,
        "fits": False,
        "step_s": current_step,
        "step_change": None,
    }


def _findings(job: Job, st, peak: float, usable: float) -> list[str]:
    """Plain-language diagnosis of where memory and time go."""
    out = []
    if peak > usable:
        out.append(
            f"out of memory: the device peaks at {peak / 2**30:.1f} GiB (tensors, allocator pool, CUDA context, "
            f"NCCL buffers), {usable / 2**30:.1f} GiB usable ({(peak - usable) / 2**30:.1f} GiB over); the fixes "
            "below each say what they free"
        )
    if st is None:
        return out
    parts = {k: float(v) for k, v in st.breakdown().items()}
    total = sum(parts.values())
    share = {k: v / total for k, v in parts.items()}
    if share["bubble_s"] > 0.1:
        out.append(
            f"pipeline bubble: {share['bubble_s']:.0%} of the step idles while the pipeline fills and drains; "
            f"more micro-batches per step (a larger global batch or smaller micro-batch) or interleaving shrink it"
        )
    if share["dp_comm_exposed_s"] > 0.1:
        out.append(
            f"communication-bound: {share['dp_comm_exposed_s']:.0%} of the step waits for data-parallel "
            "gradients; fewer nodes, a lower ZeRO stage, or buckets of 2–8 MB that overlap backward help"
        )
    if share.get("ep_comm_s", 0.0) > 0.15:
        out.append(
            f"expert parallelism's all-to-alls take {share['ep_comm_s']:.0%} of the step; an ep group inside one node "
            "(ep ≤ its devices) keeps them on the node's links"
        )
    if share["tp_comm_s"] > 0.15:
        out.append(f"tensor-parallel traffic takes {share['tp_comm_s']:.0%} of the step; keep tp within one node")
    if share["memory_bound_s"] > 0.2:
        out.append(f"memory-bound kernels take {share['memory_bound_s']:.0%}: larger micro-batches or fused kernels")
    if share["optimizer_s"] > 0.1:
        out.append(f"the optimizer step takes {share['optimizer_s']:.0%} (offload moves it to the host and over PCIe)")
    return out


def diagnose_run(run_dir: str | Path) -> dict:
    """What a run's metrics.jsonl shows: overflow, divergence, data-loading stalls, and how it compares."""
    from ..runs.folder import damaged_lines_note, read_metrics

    records = read_metrics(Path(run_dir) / "metrics.jsonl")
    if not records:
        raise SpecError("--run", str(run_dir), "holds no metrics.jsonl lines yet")
    out = [note] if (note := damaged_lines_note(Path(run_dir) / "metrics.jsonl")) else []
    skipped = [r for r in records if r.get("skipped")]
    if skipped:
        scales = [r["loss_scale"] for r in records if r.get("loss_scale")]
        out.append(
            f"fp16 overflow: {len(skipped)} of {len(records)} steps skipped, loss scale "
            f"{scales[0]:g} -> {scales[-1]:g}. A few at the start are the scaler finding its level; steady "
            "skipping means gradients overflow fp16: lower the lr, or train in bf16"
        )
    if records[-1].get("stopped") == "diverged":
        out.append(
            f"diverged at step {records[-1]['step']}: the loss became NaN/inf. Lower the lr, lengthen warm-up, "
            "keep gradient clipping on; resume from the last checkpoint"
        )
    losses = [r["loss"] for r in records if r.get("loss") is not None]
    if len(losses) > 10 and statistics.mean(losses[-5:]) > statistics.mean(losses[:5]):
        out.append("the loss rises: learning rate too high for this batch, or data that repeats badly")
    evals = [(r["step"], r["eval_loss"]) for r in records if r.get("eval_loss") is not None]
    if len(evals) >= 3 and evals[-1][1] > min(e for _, e in evals) * 1.02:
        out.append(
            f"held-out loss has risen {evals[-1][1] / min(e for _, e in evals) - 1:.1%} above its best: "
            "over-fitting (more data, dropout or weight decay) or a too-high learning rate"
        )
    times = [r["time_s"] for r in records[1:] if r.get("time_s")]
    if len(times) >= 10:
        median = statistics.median(times)
        slow = [t for t in times if t > 1.5 * median]
        if len(slow) >= max(2, len(times) // 20):
            out.append(
                f"uneven steps: {len(slow)} of {len(times)} took over 1.5× the median {median * 1e3:.0f} ms; "
                "if the data loader cannot keep up, raise training.num_workers or prefetch"
            )
    grad_norms = [r["grad_norm"] for r in records if r.get("grad_norm") is not None]
    if len(grad_norms) > 10 and np.median(grad_norms[-5:]) > 10 * np.median(grad_norms[:10]):
        out.append("gradient norm has grown tenfold: the run is heading for divergence; lower the lr")
    if not out:
        out.append("nothing abnormal in the metrics")
    return {"steps": records[-1]["step"], "findings": out}
