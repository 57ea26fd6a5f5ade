"""Calibrate from one measured step: a user's own stack on a catalog accelerator runs at some constant ratio to the
model (its kernels, its framework, its overlap settings); one measured step gives that ratio, and a profile row of
the same accelerator name carries it to every estimate and plan made with `--catalog` (toolkit.estimate.band then
uses the band calibrated runs hold: benchmarks/steptime_accuracy.py measures it).

    row = step_calibration_row(job, catalog, measured_step_s=0.85)   # toolkit calibrate --step-s 0.85
    measured_step_of_run("runs/demo")                               # toolkit calibrate --measured runs/demo
"""

from __future__ import annotations

import datetime
import statistics
from pathlib import Path

import numpy as np

from ..estimate import estimate
from ..runs.folder import read_metrics
from ..specs import Job, SpecError
from ..specs.catalog import Catalog

__all__ = ["step_calibration_row", "layouts_calibration_row", "measured_step_of_run", "WARMUP_STEPS"]

WARMUP_STEPS = 3
"""A run's first steps (compilation, allocator growth, data warm-up) left out of its measured step."""


def step_calibration_row(job: Job, catalog: Catalog, measured_step_s: float) -> dict:
    """A catalog row for the job's accelerator (its name kept, so `--catalog` applies it to any job on it) with
    the measured step's ratio to the modelled one."""
    if not measured_step_s or measured_step_s <= 0:
        raise SpecError("--step-s", measured_step_s, "must be a positive number of seconds")
    modelled = estimate(job, catalog)["time"].get("step_s")
    if modelled is None:
        raise SpecError(
            "--step-s", measured_step_s, f"{job.cluster.accelerator} has no modelled step to scale (no speed figures)"
        )
    acc = catalog.accelerator(job.cluster.accelerator)
    today = datetime.date.today().isoformat()
    layout = job.parallel
    what = (
        f"{job.model.name or 'model'} on {job.cluster.count}x{acc.name}, tp {layout.tp} pp {layout.pp} dp {layout.dp}, "
        f"global batch {job.batch.global_batch}, {job.precision.mode}"
    )
    return {
        "name": acc.name,
        "source": f"toolkit calibrate --step-s {measured_step_s:g} on {today}: measured {measured_step_s:.4g} s a step "
        f"where the model gives {modelled:.4g} s ({what})",
        "as_of": today,
        "step_calibration": {
            "scale": measured_step_s / modelled,
            "measured_step_s": measured_step_s,
            "modelled_step_s": modelled,
            "job": what,
        },
    }


def measured_step_of_run(folder: str | Path) -> tuple[Job, float]:
    """A `toolkit train` run's job and its median step after the warm-up (metrics.jsonl)."""
    folder = Path(folder)
    if not (folder / "job.yaml").is_file() or not (folder / "metrics.jsonl").is_file():
        raise SpecError("--measured", str(folder), "is not a run folder (job.yaml and metrics.jsonl): give --step-s")
    steps = [r["time_s"] for r in read_metrics(folder / "metrics.jsonl") if r.get("time_s")][WARMUP_STEPS:]
    if not steps:
        raise SpecError("--measured", str(folder), f"has no timed step after the first {WARMUP_STEPS}")
    return Job.from_yaml(folder / "job.yaml"), statistics.median(steps)


def _parts(job: Job, catalog: Catalog) -> tuple[float, float]:
    """(the modelled step's collectives, the rest) in seconds, as toolkit.estimate.steptime_result splits them."""
    from ..estimate.steptime_result import COMMUNICATION_FIELDS

    breakdown = estimate(job, catalog)["time"].get("breakdown") or {}
    if not breakdown:
        raise SpecError("--measured", job.model.name, f"{job.cluster.accelerator} has no modelled step to scale")
    comm = sum(v for k, v in breakdown.items() if k in COMMUNICATION_FIELDS)
    return comm, sum(breakdown.values()) - comm


def layouts_calibration_row(runs: list[tuple[Job, float]], catalog: Catalog) -> dict:
    """A catalog row from two or more measured layouts of one accelerator: the compute scale a and the
    collectives' scale b that best explain every measured step as a·(modelled compute) + b·(modelled collectives),
    relative errors weighted alike; one scale for both where the layouts cannot tell them apart."""
    accelerators = {job.cluster.accelerator for job, _ in runs}
    if len(accelerators) != 1:
        raise SpecError("--measured", ", ".join(sorted(map(str, accelerators))), "give runs of one accelerator")
    parts = np.array([_parts(job, catalog) for job, _ in runs])  # (collectives, rest)
    measured = np.array([step for _, step in runs])
    rows = np.column_stack([parts[:, 1], parts[:, 0]]) / measured[:, None]
    (compute, comm), *_ = np.linalg.lstsq(rows, np.ones(len(runs)), rcond=None)
    one = float(np.median(measured / parts.sum(axis=1)))
    apart = np.linalg.matrix_rank(rows, tol=0.05) == 2 and compute > 0 and comm > 0
    compute, comm = (float(compute), float(comm)) if apart else (one, one)
    predicted = parts[:, 1] * compute + parts[:, 0] * comm
    acc = catalog.accelerator(runs[0][0].cluster.accelerator)
    today = datetime.date.today().isoformat()
    return {
        "name": acc.name,
        "source": f"toolkit calibrate on {len(runs)} measured layouts on {today}: compute x{compute:.3f}, collectives "
        f"x{comm:.3f}" + ("" if apart else " (the layouts could not tell the two apart: one scale)"),
        "as_of": today,
        "step_calibration": {
            "scale": compute,
            "communication_scale": comm,
            "measured_step_s": float(measured[0]),
            "modelled_step_s": float(parts[0].sum()),
            "job": f"{len(runs)} layouts, fitted within {100 * float(np.max(np.abs(predicted / measured - 1))):.1f} %",
            "layouts": [
                {"measured_step_s": float(t), "modelled_collectives_s": float(c), "modelled_rest_s": float(r)}
                for t, (c, r) in zip(measured, parts)
            ],  # fmt: skip
        },
    }
