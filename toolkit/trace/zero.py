"""Measure DeepSpeed's ZeRO (the mixed-* modes with zero 1, 2 or 3) on real gloo ranks.

The mixed-* modes name DeepSpeed's program: 16-bit weights and gradients, fp32 master
weights and optimizer states partitioned over the dp ranks (stage 1), the 16-bit gradients
too (stage 2), and the 16-bit weights too (stage 3). DeepSpeed reads tensor values while it
steps (overflow checks, norms), so it does not run on fake tensors: each dp rank runs the
runner's GPT for real with DeepSpeed's engine on the CPU, and measures its step with
MemTracker. Real memory limits this to small models (MAX_ZERO_TRACE_BYTES).

`deepspeed_config(job)` is the DeepSpeed configuration the estimate models and the trace
runs; pass it to `deepspeed.initialize` to train with the same memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc

import torch

from ..capability import check_traceable
from ..estimate.memory import memory_estimate
from ..export.deepspeed import deepspeed_config  # (re-exported: the runner and the tracer share it)
from ..program.compat import require_internals
from ..program.instrument import DeviceTracker, offload_host_tensors, optimizer_states, snapshot, storage_bytes
from ..program.precision import torch_precision
from ..specs.backends import job_deepspeed_fp32
from ..specs.errors import SpecError
from ..specs.job import TORCH_SEMANTICS, Job
from .ranks import trace_on_ranks
from .result import MAX_TRACED_MICRO_BATCHES, TraceResult
from .steps import two_steps

__all__ = ["MAX_ZERO_TRACE_BYTES", "deepspeed_config", "trace_zero", "trace_zero_ranks"]

MAX_ZERO_TRACE_BYTES = 4 * 2**30
"""The estimated peak of all ranks together must fit in this much real memory."""


def check_zero_traceable(job: Job, estimated_total_bytes: float) -> None:
    """DeepSpeed's program at all, the capability rules of its tracer (toolkit.capability), then what this machine
    runs (fp16 needs a GPU) and holds in real memory."""
    par = job.parallel
    if (job.precision.mode in TORCH_SEMANTICS and not job_deepspeed_fp32(job)) or par.zero == 0:
        raise SpecError(
            "precision.mode",
            job.precision.mode,
            "DeepSpeed's ZeRO is traced for the mixed-* modes, and fp32 with backend deepspeed, with zero "
            "1, 2 or 3 (torch's ZeRO runs for fp32, amp-* and pure-bf16)",
        )
    check_traceable(job)
    if job.precision.mode == "mixed-fp16" and not torch.cuda.is_available():
        raise SpecError(
            "precision.mode",
            job.precision.mode,
            "DeepSpeed runs fp16 on GPUs only; trace mixed-bf16 "
            "here (the estimate treats both alike but for the loss "
            "scaler's overflow checks)",
        )
    if estimated_total_bytes > MAX_ZERO_TRACE_BYTES:
        raise SpecError(
            "model",
            job.model.name,
            f"a DeepSpeed trace allocates real memory ({estimated_total_bytes / 2**30:.1f} GiB over "
            f"{par.dp} ranks, more than {MAX_ZERO_TRACE_BYTES / 2**30:.0f} GiB): trace fewer layers, a "
            "narrower model or fewer ranks",
        )


def trace_zero(job: Job) -> TraceResult:
    """Two steps of DeepSpeed's ZeRO on dp real gloo ranks; the busiest rank's memory (of equal device peaks, the
    one holding the most in host memory, as the estimate reports)."""
    ranks = trace_zero_ranks(job)
    return max(ranks, key=lambda r: (r.peak_bytes, r.host_bytes))


def trace_zero_ranks(job: Job) -> list[TraceResult]:
    """Every dp rank's memory. (The estimate only sizes the run: it refuses ones too large.)"""
    require_internals("the trace")
    check_zero_traceable(job, float(memory_estimate(job).peak_bytes) * job.parallel.dp)
    import importlib.util

    if importlib.util.find_spec("deepspeed") is None:  # (not imported here: it logs to stdout, which --json owns)
        raise SpecError(
            "precision.mode",
            job.precision.mode,
            "DeepSpeed's ZeRO is traced with DeepSpeed itself: pip install deepspeed (or the toolkit's [test] extra)",
        )
    return trace_on_ranks(
        _trace_rank, job, job.parallel.dp, "DeepSpeed", "rank", "trace fewer layers, a narrower model or fewer ranks"
    )


def _trace_rank(job: Job, rank: int, world: int) -> TraceResult:
    """Two of the runner's steps (toolkit.program.step) of its DeepSpeed program (toolkit.program.build), the engine
    built inside the tracker, over at most MAX_TRACED_MICRO_BATCHES micro-batches a step."""
    from ..program.build import build_model, deepspeed_program
    from ..program.deepspeed import import_deepspeed

    deepspeed = import_deepspeed()
    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    micro_batches = min(job.grad_accum or 1, MAX_TRACED_MICRO_BATCHES)  # from the second on, each repeats
    batch = dataclasses.replace(job.batch, global_batch=job.batch.micro_batch * job.parallel.dp * micro_batches)
    traced = job.replace(batch=batch, training=dataclasses.replace(job.training, init_from=None))
    plan = torch_precision(job.precision.mode)
    # initialised weights: fp16 skips steps that overflow, which would hide the optimizer's states
    torch.manual_seed(job.training.seed)
    model = build_model(traced, plan.param_dtype)
    tracker = DeviceTracker()
    tracker.track_external(model)
    hooks = _ZeroHooks(tracker)
    offload = job.parallel.offload != "none"
    with tracker:
        # DeepSpeed builds its flat 16-bit and fp32 buffers here: inside the tracker, so it sees every byte
        prog = deepspeed_program(traced, model)
        engine, zero = prog.engine, prog.optimizer
        hooks.zero = zero
        if offload:  # one memory here: count what ZeRO-Offload keeps on the host apart, and its step as the host's
            tracker.host_bytes = lambda _snap: storage_bytes(offload_host_tensors(zero))
            inner_step = zero.optimizer.step

            def host_step(*args, **kwargs):
                with tracker.optimizer_step():
                    return inner_step(*args, **kwargs)

            zero.optimizer.step = host_step
        if job.parallel.zero == 1 and hasattr(zero, "reduce_gradients"):  # ZeRO-1 reduces once backward is over:
            reduce = zero.reduce_gradients  # measure the gradients before

            def measured_reduce(*args, **kwargs):
                hooks.reduced_grads = storage_bytes([p.grad for p in engine.module.parameters()])
                return reduce(*args, **kwargs)

            zero.reduce_gradients = measured_reduce
        two_steps(prog, traced, tracker, hooks)
    start, boundary, grads = hooks.start, hooks.boundary, hooks.grads
    peak = snapshot(tracker, "peak")
    # 16-bit weights: views into DeepSpeed's flat buffer (stages 1, 2), or this rank's partition (stage 3) and the
    # small vectors it keeps whole
    weights = [
        t
        for p in engine.module.parameters()
        for t in ((p.ds_tensor, p) if getattr(p, "ds_persist", False) else (getattr(p, "ds_tensor", p),))
    ]
    # activations at the boundary: what the forward added, less the weights ZeRO-3 gathered meanwhile
    activations = (boundary["Total"] - start["Total"]) - (boundary.get("PARAM", 0) - start.get("PARAM", 0))
    params_bytes = storage_bytes(weights + list(engine.module.buffers()))
    if offload:  # the device keeps the 16-bit weights; gradients and optimizer states are the host's
        return TraceResult(
            params_bytes=params_bytes,
            grads_bytes=0,
            optimizer_bytes=0,
            activations_bytes=activations,
            peak_bytes=peak["Device"],
            peak_breakdown=peak,
            boundary_breakdown=boundary,
            host_bytes=storage_bytes(offload_host_tensors(zero)),
            program=f"cpu, DeepSpeed {deepspeed.__version__} ZeRO-Offload (stage {job.parallel.zero}) "
            f"rank {rank} of {world}",
        )
    # the fp32 master partitions: the inner optimizer's parameters (stage 3 hands them over only while stepping)
    master = [p for group in zero.optimizer.param_groups for p in group["params"]]
    master += list(getattr(zero, "fp32_partitioned_groups_flat", []))
    return TraceResult(
        params_bytes=params_bytes,
        grads_bytes=grads,
        optimizer_bytes=storage_bytes(master + optimizer_states(zero)),
        activations_bytes=activations,
        peak_bytes=peak["Total"],
        peak_breakdown=peak,
        boundary_breakdown=boundary,
        program=f"cpu, DeepSpeed {deepspeed.__version__} ZeRO-{job.parallel.zero} rank {rank} of {world}",
    )


class _ZeroHooks:
    """The step's recorder in a DeepSpeed trace: each micro-batch starts from a garbage collection (DeepSpeed leaves
    tensors in reference cycles; collecting at the same points keeps the collector's timing, which moved a peak by
    up to 8 %, out of the figures) and a snapshot, its forward ends in one; the gradients are measured once the
    last backward is over (ZeRO-1: just before its reduction, which the last engine.step starts)."""

    def __init__(self, tracker):
        self.tracker, self.zero, self.reduced_grads = tracker, None, None
        self.start = self.boundary = {}
        self.grads = 0

    def micro_batch(self, last: bool) -> None:  # noqa: ARG002 - the step's hook
        gc.collect()
        self.tracker.reset_mod_stats()
        self.start = snapshot(self.tracker, "current")

    def forward_done(self) -> None:
        self.boundary = snapshot(self.tracker, "current")

    def backward_done(self) -> None:
        self.grads = self.reduced_grads or _grad_bytes(self.zero)

    @contextlib.contextmanager
    def optimizer_step(self, step: int):  # noqa: ARG002 - the step's hook
        yield


def _grad_bytes(zero) -> int:
    """The gradients ZeRO-2 and ZeRO-3 hold when the backward ends: this rank's 16-bit partition
    (`averaged_gradients`; stage 3: its flat gradient partitions); the BF16 optimizer: its whole fp32 buffer and
    the bf16 gradients beside it."""
    if hasattr(zero, "fp32_groups_gradients_flat"):
        return storage_bytes(list(zero.fp32_groups_gradients_flat) + [p.grad for g in zero.bf16_groups for p in g])
    if hasattr(zero, "grad_partitions_flat_buffer"):
        return storage_bytes([zero.grad_partitions_flat_buffer])
    return storage_bytes(t for grads in zero.averaged_gradients.values() for t in (grads or []))
