"""What the runner trains and the tracer measures, as one set of rules written once over arrays (no torch).

    refusal = run_refusal(job)        # None, or (field, value, reason): the first run rule the job breaks
    mask = runnable_mask(grid.job)    # every run rule passes, layout by layout (the planner's --runnable)
    check_traceable(job)              # SpecError naming the first trace rule the job breaks

The torch backend (toolkit.program) trains fp32, amp-* and pure-bf16: replicas (DDP), torch's ZeRO-1, ZeRO-2/3
(FSDP2, offload params included), HSDP, tensor and sequence parallelism (DTensor), dp × tp meshes, and pipelines
(GPipe, 1F1B, interleaved 1F1B; equal or uneven stages) alone, over dp, with ZeRO and tp inside; the mixed-* modes
as replicas with fp32 masters. The DeepSpeed backend trains the mixed-* modes (and fp32 where named) with
ZeRO-1/2/3 over dp, ZeRO-Offload included. Everything a rule refuses is still estimated. Each rule carries its
field, the condition in words and its one-line reason; docs/troubleshoot.md's table is `capability_markdown()`.

Imports: specs."""

from __future__ import annotations

import numpy as np

from ..specs.backends import deepspeed_fp32
from ..specs.job import Job
from ..specs.precision import TORCH_SEMANTICS
from .generate import GENERATE
from .rule import Rule, _arr
from .run import RUN
from .trace import TRACE

__all__ = [
    "Rule",
    "RULES",
    "run_refusal",
    "runnable_mask",
    "trace_path",
    "trace_refusal",
    "check_traceable",
    "generate_refusal",
    "capability_markdown",
]

RULES = RUN + TRACE + GENERATE
"""Every rule, the runner's first: what runs, then what each tracer measures, then what generate serves."""


def run_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why the runner cannot train this resolved job (field, value, reason): the first run rule that refuses."""
    for rule in RUN:
        if bool(rule.refuses(job)):
            return rule.refusal(job)
    return None


def runnable_mask(job: Job) -> np.ndarray:
    """Every run rule passes, over a layout grid's array-valued job (toolkit.estimate.grid): the planner's
    `--runnable`. tests/train/test_capability.py checks it against run_refusal on each layout."""
    ok = np.asarray(True)
    for rule in RUN:
        ok = ok & ~_arr(rule.refuses(job))
    return ok


def trace_path(job: Job) -> str:
    """Which tracer measures the job: pipeline (pp > 1, gloo ranks), deepspeed (DeepSpeed's ZeRO, gloo ranks) or
    fake (one rank on fake tensors)."""
    if job.parallel.pp > 1:
        return "pipeline"
    if (
        bool(_arr(job.parallel.zero) > 0)
        and job.precision.mode not in TORCH_SEMANTICS
        or bool(
            deepspeed_fp32(
                job.parallel.backend, job.precision.mode, job.parallel.zero, job.parallel.tp, job.parallel.pp
            )
        )
    ):
        return "deepspeed"
    return "fake"


def trace_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why the tracer cannot measure this resolved job: the first trace rule of its path that refuses."""
    path = trace_path(job)
    for rule in TRACE:
        if rule.who in ("trace", f"trace:{path}") and bool(rule.refuses(job)):
            return rule.refusal(job)
    return None


def generate_refusal(job: Job) -> tuple[str, object, str] | None:
    """Why `toolkit generate` cannot run this resolved serving job: the first of its rules that refuses."""
    for rule in GENERATE:
        if bool(rule.refuses(job)):
            return rule.refusal(job)
    return None


def check_traceable(job: Job) -> None:
    """Raise the tracer's refusal as a SpecError (one line naming the field and the way out)."""
    from ..specs.errors import SpecError

    refusal = trace_refusal(job)
    if refusal is not None:
        raise SpecError(*refusal)


def capability_markdown() -> str:
    """Every rule as docs/troubleshoot.md's table (tests/train/test_capability.py keeps that copy equal to it)."""
    lines = ["| refused by | field | when | why |", "|---|---|---|---|"]
    for rule in RULES:
        reason = rule.reason if isinstance(rule.reason, str) else "(the reason names the job's figures)"
        who = {"run": "the runner", "trace": "every tracer", "generate": "`toolkit generate`"}.get(
            rule.who, f"the {rule.who[6:]} tracer"
        )
        lines.append(f"| {who} | `{rule.field}` | {rule.when} | {reason} |")
    return "\n".join(lines)
