"""A capability rule, and the layout facts the rules are written with, over arrays (a layout grid's job) or one
job: which backend's program, whether the weights are split, replicas, micro-batches, pipelines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..specs.backends import backend_masks, bf16_optimizer, deepspeed_fp32
from ..specs.dims import experts_folded
from ..specs.job import Job
from ..specs.precision import TORCH_SEMANTICS
from ..specs.stages import empty_chunk

__all__ = ["Rule"]


@dataclass(frozen=True)
class Rule:
    who: str
    """run (the runner), trace (every tracer), or trace:fake, trace:pipeline, trace:deepspeed (one tracer path)."""
    field: str
    """The Job field to change, as the refusal names it."""
    when: str
    """The refused case in words (the docs' table)."""
    refuses: Callable[[Job], object]
    """True where the rule refuses: a bool, or a bool array over a layout grid's job."""
    reason: str | Callable[[Job], str]
    value: Callable[[Job], object] | None = None
    """The refused value, where it is not simply the field's."""
    name_field: Callable[[Job], str] | None = None
    """The field, where it depends on the job (tp or pp)."""

    def refusal(self, job: Job) -> tuple[str, object, str]:
        field = self.name_field(job) if self.name_field else self.field
        value = self.value(job) if self.value else _field_value(job, field)
        return field, value, self.reason(job) if callable(self.reason) else self.reason


def _field_value(job: Job, field: str):
    if field == "model":
        return job.model.name
    obj = job
    for part in field.split("."):
        obj = getattr(obj, part)
    return obj


def _arr(x):
    return np.asarray(x)


def _backend_is(job: Job, name: str):
    """The job's program is `name`'s (megatron, deepspeed, torch), layout by layout: the named backend, or the one
    the mode and layout infer (Job.backend)."""
    par = job.parallel
    if par.backend is not None:
        return _arr(par.backend == name)
    megatron, deepspeed = backend_masks(job.precision.mode, par.zero, par.tp, par.pp)
    deepspeed = deepspeed | deepspeed_fp32(par.backend, job.precision.mode, par.zero, par.tp, par.pp)
    return {"megatron": megatron, "deepspeed": deepspeed, "torch": ~megatron & ~deepspeed}[name]


def _tp_or_pp(job: Job) -> str:
    return "parallel.tp" if job.parallel.tp > 1 else "parallel.pp"


def _split(job: Job):
    """No rank steps every whole matrix: sharded (ZeRO-2/3, tp, ep), pipelined, or DeepSpeed's partitions."""
    par = job.parallel
    split = (_arr(par.zero) >= 2) | (_arr(par.tp) > 1) | (_arr(par.pp) > 1) | (_arr(par.ep) > 1)
    return split | _backend_is(job, "deepspeed")


def _experts_folded(job: Job):
    """The experts' own grid in the runner's program (Megatron's is refused on its own: toolkit.specs.dims)."""
    return experts_folded(job.parallel)


def _empty_chunk(job):
    """A chunk of no layers, from the job's stage_layers or its split rule (arrays over layouts allowed)."""
    par = job.parallel
    if not job.model.has_shape:
        return _arr(False)
    if par.stage_layers:
        return _arr(min(par.stage_layers) < 1)
    return empty_chunk(job.model.layers, par.pp, par.vpp)


def _replicas(job: Job):
    par = job.parallel
    return (_arr(par.zero) == 0) & (_arr(par.tp) == 1) & (_arr(par.pp) == 1) & (_arr(par.ep) == 1)


def _experts(job: Job) -> bool:
    return bool(job.model.has_shape and job.model.experts)


def _accum(job: Job):
    return np.maximum(_arr(job.grad_accum if job.grad_accum is not None else 1), 1)


def _piped(job: Job):
    return _arr(job.parallel.pp) > 1


def _bf16_optimizer(job: Job):
    return _arr(bf16_optimizer(job))  # (the estimate's own test of DeepSpeed's BF16 optimizer)


def _torch_zero(job: Job):
    return (_arr(job.parallel.zero) > 0) & (job.precision.mode in TORCH_SEMANTICS)
