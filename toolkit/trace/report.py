"""The trace in the CLI's contract: `toolkit trace` (estimate keys, memory measured) and `toolkit compare`."""

from __future__ import annotations

import dataclasses

from ..estimate import estimate
from ..estimate.flops import flops_per_token
from ..program.compat import version_note
from ..specs.catalog import Catalog, load_catalog
from ..specs.job import Job
from .memory import trace_memory

__all__ = ["traced_estimate", "compare_memory", "compare_run", "at_even_routing", "COMPARED"]

COMPARED = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes")


def traced_estimate(job: Job, catalog: Catalog | None = None) -> dict:
    """`estimate(job)` with its memory section replaced by what the fake-tensor trace measured."""
    catalog = catalog or load_catalog()
    result = estimate(job, catalog)
    resolved, _notes = job.resolve(catalog)
    traced = trace_memory(resolved)
    memory = result["memory"]
    memory.update(
        params_bytes=traced.params_bytes,
        grads_bytes=traced.grads_bytes,
        optimizer_bytes=traced.optimizer_bytes,
        states_bytes=traced.params_bytes + traced.grads_bytes + traced.optimizer_bytes,
        # a pipeline stage has no single forward/backward boundary: its activations are not measured
        activations_bytes=None if traced.stage_peaks_bytes else traced.activations_bytes,
        peak_bytes=traced.peak_bytes,
        host_bytes=traced.host_bytes,
        source="trace",
        program=traced.program,
        peak_breakdown=traced.peak_breakdown,
    )
    if memory["usable_bytes"] is not None:
        memory["fits"] = traced.peak_bytes <= memory["usable_bytes"]
    result["compute"]["traced_flops_per_token"] = traced.flops_per_token
    result["notes"] = [n for n in result["notes"] if not n.startswith(("fits:", "model states alone"))]
    how = "on real gloo ranks" if traced.stage_peaks_bytes else "on fake tensors"
    result["notes"].append(f"memory traced {how}: the {traced.program} program of one rank")
    if version_note():
        result["notes"].append(version_note())
    return result


def compare_memory(job: Job, catalog: Catalog | None = None) -> dict:
    """Analytic and traced memory side by side; error = (estimate − trace) / trace."""
    catalog = catalog or load_catalog()
    job = job.replace(memory=dataclasses.replace(job.memory, program="cpu"))  # the program the tracer runs
    job = at_even_routing(job)
    analytic = estimate(job, catalog)["memory"]
    traced = traced_estimate(job, catalog)
    rows = {}
    offload = analytic.get("host_bytes") or traced["memory"]["host_bytes"]
    for key in COMPARED + (("host_bytes",) if offload else ()):  # (host memory: with offload only)
        est, tr = analytic[key], traced["memory"][key]
        error = None if est is None or not tr else (est - tr) / tr  # (tr None: not measured)
        rows[key] = {"estimate": est, "trace": tr, "error": error}
    flops = {"estimate": None, "trace": traced["compute"]["traced_flops_per_token"], "error": None}
    resolved, _ = job.resolve(catalog)
    if resolved.memory.attention == "eager" and resolved.model.has_shape and flops["trace"]:
        # FlopCounterMode sees the eager program's full score matrix: compare like with like
        flops["estimate"] = flops_per_token(resolved, causal=False).hardware
        flops["error"] = (flops["estimate"] - flops["trace"]) / flops["trace"]
    return {
        "job": traced["job"],
        "program": traced["memory"]["program"],
        "memory": rows,
        "flops_per_token": flops,
        "peak_breakdown": traced["memory"]["peak_breakdown"],
    }


def at_even_routing(job: Job) -> Job:
    """A Mixture of Experts' job as the tracer runs it: fake tensors have no values to route by, so every expert
    takes an even share (toolkit.program.moe.expert_counts); the estimate beside it is priced so too."""
    if not job.model.experts or job.model.expert_imbalance is not None:
        return job
    return job.replace(model=dataclasses.replace(job.model, expert_imbalance=1.0))


def at_rank_routing(job: Job, record: dict) -> Job:
    """A Mixture of Experts' job priced at the load a rank measured (rows its experts took over an even share,
    toolkit.train.memory_record), as the expert imbalance that gives that load at the job's ep
    (toolkit.estimate.moe.expert_load inverted); without expert parallelism every rank takes its own tokens (1)."""
    from ..estimate.moe import imbalance_for_load

    load = record.get("expert_load")
    if not job.model.experts or job.model.expert_imbalance is not None:
        return job
    imbalance = 1.0 if load is None else imbalance_for_load(job.model, job.parallel.ep, load)
    return job.replace(model=dataclasses.replace(job.model, expert_imbalance=imbalance))


def _error(estimate, measured):
    return None if estimate is None or not measured else (estimate - measured) / measured


def _traced_peak(traced, stage: int):
    """The trace's peak for a run's rank: its own stage's where the trace measured each stage."""
    if traced is None:
        return None
    stages = traced.stage_peaks_bytes
    return stages[stage] if stages and stage < len(stages) else traced.peak_bytes


def compare_run(out_dir, catalog_files=(), trace: bool = True) -> dict:
    """A finished (or running) `toolkit train` folder: estimate, trace and measured memory per rank, and modelled
    against measured step time. error = (estimate − measured) / measured. The trace is None where the tracer
    does not cover the layout or `trace` is False (`trace_note` says why). `catalog_files` (a `toolkit calibrate` profile) give the
    step-time model this machine's figures: a run on no catalog accelerator is modelled on the profile's."""
    import statistics
    from pathlib import Path

    from ..estimate.memory import stage_memory_estimate
    from ..runs.folder import read_metrics, read_rank_memory
    from ..specs.errors import SpecError

    out = Path(out_dir)
    if not (out / "job.yaml").is_file():
        raise SpecError("--run", str(out), "holds no job.yaml: give the --out folder of a `toolkit train` run")
    from ..runs.folder import run_catalog_files

    catalog = load_catalog(*run_catalog_files(out), *catalog_files)  # the run's own rows, then the user's
    job, _notes = Job.from_yaml(out / "job.yaml", catalog).resolve(catalog)
    profiled = _profile_accelerators(catalog_files)
    if job.cluster.accelerator is None and len(profiled) == 1:  # the run's own program, this machine's figures
        job = job.replace(cluster=dataclasses.replace(job.cluster, accelerator=profiled[0]))
        job, _notes = job.resolve(catalog)
    traced, trace_note = None, "not traced (--no-trace)"
    try:
        if trace:
            traced, trace_note = trace_memory(job), None
    except SpecError as err:
        traced, trace_note = None, str(err)
    ranks = []
    for record in read_rank_memory(out):
        analytic = stage_memory_estimate(at_rank_routing(job, record), record["stage"])  # pipelines: its stage
        measured = record["peak_bytes"]
        states = record.get("states") or {}
        categories = {
            key: {
                "estimate": float(getattr(analytic, key)),
                "trace": getattr(traced, key, None),
                "measured": states.get(key),
            }
            for key in ("params_bytes", "grads_bytes", "optimizer_bytes")
        }
        ranks.append(
            {
                "rank": record["rank"],
                "stage": record["stage"],
                "instrument": record["instrument"],
                "steps": record["steps"],
                "peak_bytes": {
                    "estimate": float(analytic.peak_bytes),
                    "trace": _traced_peak(traced, record["stage"]),
                    "measured": measured,
                    "error": _error(float(analytic.peak_bytes), measured),
                },
                "categories": categories,
                "peak_breakdown": record["categories"],
            }
        )
    recorded = max((max(r["steps"]) for r in ranks), default=0)
    steady = [r["time_s"] for r in read_metrics(out / "metrics.jsonl") if r["step"] > recorded and r.get("time_s")]
    measured_s = statistics.median(steady) if steady else None
    estimated_s = estimate(job, catalog)["time"].get("step_s")
    return {
        "run": str(out),
        "job": job.to_dict(),
        "ranks": ranks,
        "trace_note": trace_note,
        "time": {"step_s": {"estimate": estimated_s, "measured": measured_s, "error": _error(estimated_s, measured_s)}},
    }


def _profile_accelerators(files) -> list[str]:
    """Names of the accelerator rows the given catalog files define."""
    from ..specs.yamlio import read_yaml

    names = []
    for path in files:
        data = read_yaml(path, what="catalog file") or {}
        names += [row["name"] for row in data.get("accelerators") or [] if isinstance(row, dict) and "name" in row]
    return names
