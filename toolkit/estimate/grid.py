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

from ..specs.job import TORCH_SEMANTICS, Job
from ..specs.resolve import interleaved_rounds_fit
from ..specs.stages import uneven_fits

__all__ = ["LayoutGrid", "layout_grid", "AXES"]

AXES = {"tp": "parallel", "pp": "parallel", "vpp": "parallel", "cp": "parallel", "sp": "parallel", "zero": "parallel",
        "offload": "parallel", "micro_batch": "batch", "recompute": "memory"}
"""The fields a grid may vary, and the Job section each lives in. dp follows: devices / (tp·pp·cp)."""


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


def layout_grid(job: Job, **axes) -> LayoutGrid:
    """The cartesian product of `axes` (e.g. tp=[1, 2, 8]) applied to a resolved job of fixed devices and batch."""
    unknown = set(axes) - set(AXES)
    if unknown:
        raise ValueError(f"cannot vary {sorted(unknown)}; a grid varies {sorted(AXES)}")
    names = list(axes)
    rows = list(itertools.product(*(axes[n] for n in names)))
    columns = {n: np.array([r[i] for r in rows]) for i, n in enumerate(names)}
    sections = {"parallel": {}, "batch": {}, "memory": {}}
    for name, values in columns.items():
        sections[AXES[name]][name] = values
    par = dataclasses.replace(job.parallel, **sections["parallel"])
    devices = job.cluster.count
    model_parallel = np.asarray(par.tp) * np.asarray(par.pp) * np.asarray(par.cp)
    par = dataclasses.replace(par, dp=np.maximum(devices // model_parallel, 1))
    grid_job = dataclasses.replace(job, parallel=par, batch=dataclasses.replace(job.batch, **sections["batch"]),
                                   memory=dataclasses.replace(job.memory, **sections["memory"]))
    return LayoutGrid(job=grid_job, valid=_valid(grid_job, devices, len(rows)))


def _valid(job: Job, devices: int, n: int) -> np.ndarray:
    """The layout rules of toolkit.specs.resolve, over arrays."""
    m, par = job.model, job.parallel
    tp, pp, vpp, dp = (np.broadcast_to(np.asarray(x), (n,)) for x in (par.tp, par.pp, par.vpp, par.dp))
    zero, offload = np.broadcast_to(np.asarray(par.zero), (n,)), np.broadcast_to(np.asarray(par.offload), (n,))
    micro = np.broadcast_to(np.asarray(job.batch.micro_batch), (n,))
    cp = np.broadcast_to(np.asarray(par.cp), (n,))
    ok = (devices % (tp * pp * cp) == 0) & (m.heads % tp == 0) & (m.kv_heads_ % tp == 0)
    ok &= m.seq_len % (2 * cp) == 0
    ok &= uneven_fits(m.layers, pp, vpp)          # the first and last chunk may hold fewer (toolkit.specs.stages)
    ok &= (vpp == 1) | (pp > 1)
    ok &= ~np.broadcast_to(np.asarray(par.sp), (n,)) | (tp > 1)
    ok &= job.batch.global_batch % (micro * dp) == 0
    ok &= (vpp == 1) | interleaved_rounds_fit(job.batch.global_batch // (micro * dp), pp)
    torch_semantics = job.precision.mode in TORCH_SEMANTICS
    ok &= (offload != "optimizer") | ((not torch_semantics) & (zero >= 1))
    ok &= (offload != "params") | (zero == 3) | (torch_semantics & (zero == 2))
    if job.finetune.adapters:            # LoRA/QLoRA are modelled for replicas (toolkit.specs.resolve)
        ok &= (tp == 1) & (pp == 1) & (zero <= 1)
    return ok
