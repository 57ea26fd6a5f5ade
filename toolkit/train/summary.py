"""What a finished run measured, beside what the estimate said: `toolkit train` prints it at the end."""

from __future__ import annotations

import statistics
from pathlib import Path

from ..estimate.memory import memory_estimate
from ..runs.folder import read_metrics, read_rank_memory, run_catalog_files
from ..specs import Job, load_catalog
from ..views.text import gib

__all__ = ["run_summary", "render_run_summary"]


def run_summary(out_dir: str | Path) -> dict:
    """Measured figures of the run in `out_dir` and the estimate of the same job (per rank)."""
    out = Path(out_dir)
    catalog = load_catalog(*run_catalog_files(out))
    job, _ = Job.from_yaml(out / "job.yaml", catalog).resolve(catalog)
    records = [r for r in read_metrics(out / "metrics.jsonl") if r.get("loss") is not None]
    steady = records[1:] or records  # the first step pays for start-up
    losses = [r["loss"] for r in records]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    mem = memory_estimate(job)
    recorded = read_rank_memory(out)  # each rank's tensor peak over its first steps
    base = min((r["mem_base_bytes"] for r in records if "mem_base_bytes" in r), default=None)
    peak_mem = max((r["mem_bytes"] for r in records), default=None)
    return {
        "steps": records[-1]["step"] if records else 0,
        "ranks": job.parallel.dp * job.parallel.tp * job.parallel.pp,
        "precision": job.precision.mode,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "last_eval_loss": evals[-1] if evals else None,
        "tokens_per_s": statistics.median(r["tokens_per_s"] for r in steady) if steady else None,
        "tflops_per_rank": statistics.median(r["tflops"] for r in steady) if steady else None,
        "mfu": statistics.median(r["mfu"] for r in steady) if steady and steady[0]["mfu"] is not None else None,
        "mem_kind": records[-1]["mem_kind"] if records else None,
        "measured_peak_bytes": peak_mem,
        "measured_growth_bytes": peak_mem - base if peak_mem is not None and base is not None else None,
        "estimated_peak_bytes": mem.peak_bytes,
        "estimated_phase": mem.peak_phase,
        "tensor_peak_bytes": max((r["peak_bytes"] for r in recorded), default=None),
        **_device_peaks(job, catalog, recorded),
    }


def _device_peaks(job: Job, catalog, recorded: list[dict]) -> dict:
    """On a GPU, the busiest rank's reserved and device-visible peaks beside the estimate's (none on CPU)."""
    reserved = [r["reserved_peak_bytes"] for r in recorded if r.get("reserved_peak_bytes") is not None]
    device = [r["device_peak_bytes"] for r in recorded if r.get("device_peak_bytes") is not None]
    if not reserved:
        return {}
    from ..estimate.report import estimate

    est = estimate(job, catalog)["memory"]
    return {
        "reserved_peak_bytes": max(reserved),
        "device_peak_bytes": max(device, default=None),
        "estimated_reserved_peak_bytes": est["reserved_peak_bytes"],
        "estimated_device_peak_bytes": est["device_peak_bytes"],
    }


def render_run_summary(out_dir: str | Path) -> str:
    s = run_summary(out_dir)
    if not s["steps"]:
        return f"{out_dir}: no steps recorded"
    lines = [
        f"{out_dir}: {s['steps']} steps on {s['ranks']} rank(s), {s['precision']}",
        f"  loss          {s['first_loss']:.4f} -> {s['last_loss']:.4f}"
        + (f" (held-out {s['last_eval_loss']:.4f})" if s["last_eval_loss"] is not None else ""),
        f"  throughput    {s['tokens_per_s']:,.0f} tokens/s (median step), "
        f"{s['tflops_per_rank'] * 1e3:.2f} GFLOP/s per rank, MFU "
        + (f"{s['mfu']:.1%}" if s["mfu"] is not None else "n/a (no catalog peak: give --peak-tflops)"),
    ]
    estimate = f"estimate {gib(s['estimated_peak_bytes'])} of tensors at {s['estimated_phase']}"
    if s["mem_kind"] == "rss":
        measured = (
            f"measured RSS growth {gib(s['measured_growth_bytes'])} (peak RSS {gib(s['measured_peak_bytes'])} "
            "counts the interpreter and libraries too)"
        )
    else:
        measured = f"measured {s['mem_kind']} {gib(s['measured_peak_bytes'])}"
    if s["tensor_peak_bytes"] is not None:  # like with like: the ranks' own tensors (toolkit compare --run)
        measured = f"measured tensors {gib(s['tensor_peak_bytes'])} (busiest rank); {measured}"
    lines.append(f"  memory/rank   {estimate}; {measured}")
    if "reserved_peak_bytes" in s:

        def shown(key):
            return gib(s[key]) if s[key] is not None else "n/a"

        lines.append(
            f"  device/rank   reserved {shown('reserved_peak_bytes')} (estimate "
            f"{shown('estimated_reserved_peak_bytes')}), in use on the device {shown('device_peak_bytes')} "
            f"(estimate {shown('estimated_device_peak_bytes')})"
        )
    return "\n".join(lines)
