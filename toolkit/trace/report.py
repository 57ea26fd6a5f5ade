"""The trace in the CLI's contract: `toolkit trace` (estimate keys, memory measured) and `toolkit compare`."""
from __future__ import annotations

import dataclasses

from ..estimate import estimate
from ..estimate.flops import flops_per_token
from ..specs.catalog import Catalog, load_catalog
from ..specs.job import Job
from .memory import trace_memory

__all__ = ["traced_estimate", "compare_memory", "COMPARED"]

COMPARED = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "peak_bytes")


def traced_estimate(job: Job, catalog: Catalog | None = None) -> dict:
    """`estimate(job)` with its memory section replaced by what the fake-tensor trace measured."""
    catalog = catalog or load_catalog()
    result = estimate(job, catalog)
    resolved, _notes = job.resolve(catalog)
    traced = trace_memory(resolved)
    memory = result["memory"]
    memory.update(params_bytes=traced.params_bytes, grads_bytes=traced.grads_bytes,
                  optimizer_bytes=traced.optimizer_bytes,
                  states_bytes=traced.params_bytes + traced.grads_bytes + traced.optimizer_bytes,
                  # a pipeline stage has no single forward/backward boundary: its activations are not measured
                  activations_bytes=None if traced.stage_peaks_bytes else traced.activations_bytes,
                  peak_bytes=traced.peak_bytes, host_bytes=traced.host_bytes,
                  source="trace", program=traced.program, peak_breakdown=traced.peak_breakdown)
    if memory["usable_bytes"] is not None:
        memory["fits"] = traced.peak_bytes <= memory["usable_bytes"]
    result["compute"]["traced_flops_per_token"] = traced.flops_per_token
    result["notes"] = [n for n in result["notes"] if not n.startswith(("fits:", "model states alone"))]
    how = "on real gloo ranks" if traced.stage_peaks_bytes else "on fake tensors"
    result["notes"].append(f"memory traced {how}: the {traced.program} program of one rank")
    return result


def compare_memory(job: Job, catalog: Catalog | None = None) -> dict:
    """Analytic and traced memory side by side; error = (estimate − trace) / trace."""
    catalog = catalog or load_catalog()
    job = job.replace(memory=dataclasses.replace(job.memory, program="cpu"))   # the program the tracer runs
    analytic = estimate(job, catalog)["memory"]
    traced = traced_estimate(job, catalog)
    rows = {}
    offload = analytic.get("host_bytes") or traced["memory"]["host_bytes"]
    for key in COMPARED + (("host_bytes",) if offload else ()):       # (host memory: with offload only)
        est, tr = analytic[key], traced["memory"][key]
        error = None if est is None or not tr else (est - tr) / tr          # (tr None: not measured)
        rows[key] = {"estimate": est, "trace": tr, "error": error}
    flops = {"estimate": None, "trace": traced["compute"]["traced_flops_per_token"], "error": None}
    resolved, _ = job.resolve(catalog)
    if resolved.memory.attention == "eager" and resolved.model.has_shape and flops["trace"]:
        # FlopCounterMode sees the eager program's full score matrix: compare like with like
        flops["estimate"] = flops_per_token(resolved, causal=False).hardware
        flops["error"] = (flops["estimate"] - flops["trace"]) / flops["trace"]
    return {"job": traced["job"], "program": traced["memory"]["program"], "memory": rows,
            "flops_per_token": flops, "peak_breakdown": traced["memory"]["peak_breakdown"]}
