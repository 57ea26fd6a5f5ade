"""Many layouts of one job at once: the memory model over numpy arrays.

The functions of toolkit.estimate accept a Job whose layout fields (dp, tp, pp, vpp, cp, sp,
zero, offload, micro-batch, recompute) are numpy arrays of equal length, and return arrays.
A slider move and a planner's search therefore run the same tested code.

    grid = layout_grid(job, tp=[1, 2, 4, 8], pp=[1, 2, 4], zero=[0, 1, 2, 3], micro_batch=[1, 2, 4])
    mem = memory_estimate(grid.job)          # arrays, one entry per layout
    fits = grid.valid & (mem.peak_bytes <= usable_bytes)
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

import numpy as np

from ..specs.axes import AXES as LAYOUT_AXES
from ..specs.axes import data_parallel
from ..specs.job import Job
from ..specs.rules import layout_valid

__all__ = ["LayoutGrid", "layout_grid", "AXES"]

AXES = {axis.name: axis.section for axis in LAYOUT_AXES}
"""The fields a grid may vary (toolkit.specs.axes), and the Job section each lives in. dp follows by the dp rule."""


@dataclass(frozen=True)
class LayoutGrid:
    job: Job
    """The job with array-valued layout fields (one entry per layout)."""
    valid: np.ndarray
    """Layouts the Job's rules allow (the same rules `Job.resolve` applies, vectorised)."""

    def __len__(self) -> int:
        return len(self.valid)

    def layout(self, i: int) -> dict:
        """The i-th layout as plain values, e.g. to build its Job for a closer look."""
        out = {}
        for name, section in {**AXES, "dp": "parallel"}.items():
            value = getattr(getattr(self.job, section), name)
            out[name] = np.asarray(value)[i].item() if np.ndim(value) else value
        return out

    def take(self, index: np.ndarray) -> LayoutGrid:
        """The layouts at `index` only: a search keeps the valid ones before pricing them (a fifth of DeepSeek-V3's
        430,080 on 1024 GPUs), which keeps the arrays small enough to plan in seconds."""
        sections = {}
        for name, section in {**AXES, "dp": "parallel"}.items():
            value = getattr(getattr(self.job, section), name)
            if np.ndim(value):
                sections.setdefault(section, {})[name] = np.asarray(value)[index]
        job = dataclasses.replace(
            self.job, **{sec: dataclasses.replace(getattr(self.job, sec), **f) for sec, f in sections.items()}
        )
        return LayoutGrid(job=job, valid=self.valid[index])


def layout_grid(job: Job, **axes) -> LayoutGrid:
    """The cartesian product of `axes` (e.g. tp=[1, 2, 8]) applied to a resolved job of fixed devices and batch."""
    unknown = set(axes) - set(AXES)
    if unknown:
        raise ValueError(f"cannot vary {sorted(unknown)}; a grid varies {sorted(AXES)}")
    names = list(axes)
    rows = list(itertools.product(*(axes[n] for n in names)))
    columns = {n: np.array([r[i] for r in rows]) for i, n in enumerate(names)}
    sections = {section: {} for section in ("parallel", "batch", "memory")}
    for name, values in columns.items():
        sections[AXES[name]][name] = values
    par = dataclasses.replace(job.parallel, **sections["parallel"])
    devices = job.cluster.count
    par = dataclasses.replace(par, dp=data_parallel(devices, par))
    grid_job = dataclasses.replace(
        job,
        parallel=par,
        batch=dataclasses.replace(job.batch, **sections["batch"]),
        memory=dataclasses.replace(job.memory, **sections["memory"]),
    )
    return LayoutGrid(job=grid_job, valid=_valid(grid_job, devices, len(rows)))


def _valid(job: Job, devices: int, n: int) -> np.ndarray:
    """The layout rules of toolkit.specs.rules (the ones Job.resolve applies), over arrays."""
    return np.broadcast_to(layout_valid(job, devices), (n,)).copy()
