"""The MoE options a search chooses for each layout: the dispatcher (NCCL's all-to-all, or DeepEP's kernels on
NVIDIA parts) and the overlap of one micro-batch's dispatch and combine with another's compute (Megatron-Core's
`--overlap-moe-expert-parallel-comm`). Both change the step's time only, so each layout keeps its fastest.

    st, options = fastest_moe_options(grid.job, hw, vendor="NVIDIA", fixed=set())
    options["dispatcher"][i], options["ep_comm"][i]     # what layout i was priced with

Imports: specs, estimate.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..estimate.hardware import Hardware
from ..estimate.steptime import StepTime, step_time
from ..specs.job import Job

__all__ = ["DISPATCHERS", "fastest_moe_options", "overlap_allowed"]

DISPATCHERS = ("alltoall", "deepep", "allgather")
"""What a search tries: NCCL's all-to-all, DeepEP's kernels (NVIDIA parts only, its README) and Megatron's allgather
dispatcher (cheapest for a small ep group inside one node)."""


def overlap_allowed(job: Job) -> np.ndarray:
    """Where Megatron-Core accepts `--overlap-moe-expert-parallel-comm` (its MoE A2A-overlap guide, 2026): expert
    parallelism, an interleaved schedule when pipelined, no full recompute, and the all-to-all or flex (DeepEP)
    dispatcher. Layout fields may be arrays."""
    par = job.parallel
    ep, pp, vpp = (np.asarray(x) for x in (par.ep, par.pp, par.vpp))
    dispatcher_ok = np.asarray(job.moe.dispatcher) != "allgather"
    return (ep > 1) & ((pp == 1) | (vpp > 1)) & (np.asarray(job.memory.recompute) != "full") & dispatcher_ok


def fastest_moe_options(job: Job, hw: Hardware, *, vendor: str, fixed: set[str]) -> tuple[StepTime, dict | None]:
    """The step time of each layout of `job` (array-valued) at its fastest dispatcher and overlap, and which those
    are (None for a dense model, or when the user fixed both)."""
    free_dispatcher = "dispatcher" not in fixed
    free_overlap = "ep_comm" not in fixed
    if not job.model.experts or not (free_dispatcher or free_overlap):
        return step_time(job, hw), None
    dispatchers = (DISPATCHERS if vendor == "NVIDIA" else ("alltoall", "allgather")) if free_dispatcher else None
    dispatchers = dispatchers or (job.moe.dispatcher,)
    overlaps = (False, True) if free_overlap else (job.overlap.ep_comm,)
    best, best_s, options = None, None, None
    for dispatcher in dispatchers:
        for overlap in overlaps:
            trial = job.replace(
                moe=dataclasses.replace(job.moe, dispatcher=dispatcher),
                overlap=dataclasses.replace(job.overlap, ep_comm=overlap),
            )
            st = step_time(trial, hw)
            step_s = np.asarray(st.step_s, dtype=float)
            if overlap and free_overlap:
                step_s = np.where(overlap_allowed(trial), step_s, np.inf)
            if best is None:
                best, best_s = st, step_s
                n = np.shape(step_s)
                options = {"dispatcher": np.full(n, dispatcher, dtype=object), "ep_comm": np.full(n, overlap)}
                continue
            faster = step_s < best_s
            best, best_s = _select(faster, st, best), np.where(faster, step_s, best_s)
            options["dispatcher"] = np.where(faster, dispatcher, options["dispatcher"])
            options["ep_comm"] = np.where(faster, overlap, options["ep_comm"])
    return best, options


def _select(where: np.ndarray, new: StepTime, old: StepTime) -> StepTime:
    """A StepTime taking `new`'s figures where `where` holds and `old`'s elsewhere, field by field."""
    pick = lambda a, b: np.where(where, a, b) if np.ndim(a) or np.ndim(b) or a != b else a  # noqa: E731
    changes = {}
    for field in dataclasses.fields(old):
        a, b = getattr(new, field.name), getattr(old, field.name)
        changes[field.name] = tuple(pick(x, y) for x, y in zip(a, b)) if isinstance(a, tuple) else pick(a, b)
    return dataclasses.replace(old, **changes)
