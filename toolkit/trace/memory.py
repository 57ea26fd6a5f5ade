"""Measure a Job's memory by running its real training step on fake tensors.

Under `FakeTensorMode` no tensor owns memory, so a 70B model traces on a laptop; torch's
`MemTracker` attributes every storage the program creates to parameters, gradients,
optimizer states, activations or temporaries. We run two of the runner's own training steps
(toolkit.trace.steps over toolkit.program.step: the same micro-batch loop, gradient moves to the
fp32 masters, clipping and update `toolkit train` runs; the second step is the steady one: optimizer
states exist throughout) and report, per device:

- params/optimizer bytes: persistent states after the step (buffers count as params; the
  fp32 master copy of `mixed-*` counts as optimizer state, as in the estimate);
- grads_bytes: gradients held once the last backward is over (before mixed-* moves them to the masters);
- activations_bytes: what the last micro-batch holds at the forward/backward boundary;
- peak_bytes: the largest total seen during the steady step, with its breakdown.

This is the CPU program (see toolkit.program.model). It traces one rank of a replicated
layout, of FSDP2 (ZeRO-2/3 under torch semantics), of tensor (and sequence) parallelism
with torch's DTensor plans (toolkit.program.parallel), or of both on a dp x tp mesh
(torchtitan's 2-D layout), all but the first on a fake process group. Pipelines run on real
gloo ranks (toolkit.trace.pipeline), and so does DeepSpeed's ZeRO (toolkit.trace.zero). FSDP2's CPU
offload is traced with the states FSDP keeps on the host counted apart from the device's. 8-bit
optimizers read their states while stepping, so they run on real tensors (small models only).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings

import torch
import torch.distributed as dist
from torch.utils.flop_counter import FlopCounterMode

from ..capability import check_traceable, trace_path
from ..estimate.phases import ddp_buckets
from ..program.build import Program, frozen_matrices_to, steppers
from ..program.compat import FakeStore, FakeTensorMode, MemTracker, require_internals
from ..program.compat import sharding_prop as _sharding_prop
from ..program.instrument import DeviceTracker, FSDPDeviceTracker, fsdp_host_bytes, snapshot
from ..program.layout import Layout
from ..program.lora import apply_lora
from ..program.mesh import build_mesh, fsdp_mesh
from ..program.model import GPT
from ..program.moe import expert_parallel
from ..program.parallel import loss_parallel, shard_embedding_grad, tensor_parallel
from ..program.parallelize import apply_fsdp, is_sharded
from ..program.precision import TORCH_DTYPES, torch_precision
from ..program.qlora import apply_qlora
from ..specs.dims import ParallelDims
from ..specs.errors import SpecError
from ..specs.job import Job
from .ddp import DDPBuckets
from .result import MAX_TRACED_MICRO_BATCHES, TraceResult
from .steps import TraceHooks, random_batches, two_steps

__all__ = ["TraceResult", "trace_memory", "MAX_TRACED_MICRO_BATCHES"]


def _compute_dtype(job: Job) -> torch.dtype:
    return torch.float16 if job.precision.plan.half == "fp16" else torch.bfloat16


def trace_memory(job: Job) -> TraceResult:
    """Trace one device of a resolved job (its CPU program). Pipelines run on real gloo ranks
    (toolkit.trace.pipeline): the busiest stage."""
    require_internals("the trace")
    check_traceable(job)  # the capability rules (toolkit.capability) of the job's tracer
    path = trace_path(job)
    if path == "pipeline":
        from .pipeline import trace_pipeline

        return trace_pipeline(job)
    if path == "deepspeed":
        from .zero import trace_zero

        return trace_zero(job)
    if job.parallel.zero >= 2:
        return _trace_fsdp(job)
    weights_dtype = TORCH_DTYPES[job.precision.plan.weights]
    tp, zero1, ep = job.parallel.tp, job.parallel.zero == 1, job.parallel.ep
    if job.optimizer.name == "adamw-8bit":
        return _trace_real(job, weights_dtype)
    if ep > 1:
        fake_group = _fake_process_group(job.parallel.dp, tp, ep=ep)
    elif tp > 1:
        fake_group = _fake_process_group(1, tp)
    elif zero1:  # ZeRO-1 shards over the dp ranks
        fake_group = _fake_process_group(job.parallel.dp)
    else:
        fake_group = contextlib.nullcontext()
    sliced = tp > 1 or ep > 1
    with fake_group as mesh:
        if sliced:  # DTensor plans apply to real modules: shard on the meta device, then materialise as fakes
            with torch.device("meta"):
                model = GPT(
                    job.model, attention=job.memory.attention, recompute=job.memory.recompute, dtype=weights_dtype
                )
            if tp > 1:
                tensor_parallel(model, mesh["tp"], sequence_parallel=job.parallel.sp)
            if ep > 1:
                expert_parallel(model, mesh["ep"])
        with FakeTensorMode(allow_non_fake_inputs=sliced), _propagation_apart():
            if sliced:
                model.to_empty(device="cpu")
                if tp > 1:
                    shard_embedding_grad(model)
                elif job.model.tie_embeddings:  # (to_empty makes the tied pair two tensors; the plan re-ties them)
                    model.head.weight = model.tok.weight
            else:
                model = GPT(
                    job.model, attention=job.memory.attention, recompute=job.memory.recompute, dtype=weights_dtype
                )
            return _trace_single(job, model)


MAX_REAL_TRACE_BYTES = 4 * 2**30
"""A trace on real tensors (8-bit optimizers) must fit in this much memory, by the estimate."""


def _trace_real(job: Job, weights_dtype: torch.dtype) -> TraceResult:
    """bitsandbytes' 8-bit optimizers read their states' values while stepping, so they do not run on fake
    tensors: a small model is traced on real ones instead (the same tracker, the same step)."""
    from ..estimate.memory import memory_estimate

    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise SpecError(
            "optimizer.name",
            "adamw-8bit",
            "tracing it runs bitsandbytes for real: pip install bitsandbytes (or the toolkit's [test] extra)",
        ) from None
    estimated = float(memory_estimate(job).peak_bytes)
    if estimated > MAX_REAL_TRACE_BYTES:
        raise SpecError(
            "model",
            job.model.name,
            f"an 8-bit optimizer is traced on real tensors ({estimated / 2**30:.1f} GiB by the estimate, "
            f"more than {MAX_REAL_TRACE_BYTES / 2**30:.0f} GiB): trace fewer layers or a narrower model",
        )
    torch.manual_seed(0)
    model = GPT(job.model, attention=job.memory.attention, recompute=job.memory.recompute, dtype=weights_dtype)
    result = _trace_single(job, model)
    return dataclasses.replace(result, program="cpu, real tensors (bitsandbytes)")


@contextlib.contextmanager
def _propagation_apart():
    """DTensor computes some output shapes by running the op on fake tensors of the global shape, in the
    active fake mode; MemTracker skips such ops only when they run in another mode, so give them their own
    (otherwise the vocabulary-parallel loss counts two full-vocabulary logit copies no real rank allocates)."""
    own = FakeTensorMode()
    saved = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args: own
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = saved


def _trace_single(job: Job, model: torch.nn.Module) -> TraceResult:
    """One rank whose parameters are whole (replicas) or DTensor shards (tensor parallelism)."""
    ft = job.finetune
    if ft.method == "lora":
        apply_lora(model, ft.rank, ft.alpha, ft.targets)
        if ft.base_16bit(job.precision.mode):  # as the runner keeps its base (toolkit.program.build)
            frozen_matrices_to(model, _compute_dtype(job))
    elif ft.method == "qlora":
        apply_qlora(model, ft.rank, ft.alpha, ft.targets, compute_dtype=_compute_dtype(job))
    prog = _traced_program(job, model)
    tracker = DeviceTracker()
    tracker.track_external(model, prog.optimizer, *(prog.master.params if prog.master else []))
    main_grads = prog.master is not None and prog.master.main_grads is not None
    if main_grads:
        tracker.track_gradients(prog.master.main_grads)
    buckets = DDPBuckets(model, tracker) if bool(ddp_buckets(job)) and not main_grads else None
    with warnings.catch_warnings():  # (MemTracker's own gradient hook finds the 16-bit gradient already dropped)
        warnings.filterwarnings("ignore", "Expected a tensor or a traceable wrapper-subclass", UserWarning)
        snaps = _run_steps(job, tracker, prog, buckets)
    return TraceResult(
        params_bytes=snaps["after"].get("PARAM", 0) + snaps["after"].get("BUFFER", 0),
        grads_bytes=snaps["before_step"].get("GRAD", 0),
        optimizer_bytes=snaps["after"].get("OPT", 0) + snaps["after"].get("OTH", 0),
        activations_bytes=snaps["boundary"].get("ACT", 0),
        peak_bytes=snaps["peak"].get("Total", 0),
        peak_breakdown=snaps["peak"],
        boundary_breakdown=snaps["boundary"],
        flops_per_token=snaps["flops"] / (job.batch.micro_batch * job.model.seq_len),
    )


def _traced_program(job: Job, model: torch.nn.Module) -> Program:
    """The runner's program around an already laid-out model (toolkit.program.build): its fp32 masters (mixed-*),
    its optimizer (ZeroRedundancyOptimizer over the process group's ranks at ZeRO-1). The replicas' all-reduce
    is DDP's, whose buckets toolkit.trace.ddp stands in for."""
    zero1 = job.parallel.zero == 1 and job.backend != "deepspeed"
    master, params, optimizer = steppers(
        job, torch_precision(job.precision.mode), model, dist.group.WORLD if zero1 else None
    )
    return Program(model, model, optimizer, master, params, Layout(sharded=is_sharded(job), zero1=zero1))


def _run_steps(job: Job, tracker: MemTracker, prog: Program, buckets: DDPBuckets | None = None) -> dict[str, dict]:
    """The runner's two steps under the tracker (toolkit.trace.steps); snapshots at the boundary, once the
    gradients are made, after the update, and the peak; and the FLOPs of one more micro-batch."""
    hooks, batches = TraceHooks(tracker, buckets), random_batches(job)
    with tracker:
        two_steps(prog, job, tracker, hooks, min(job.grad_accum or 1, MAX_TRACED_MICRO_BATCHES), batches)
        hooks.snaps["after"] = snapshot(tracker, "current")
    snaps = dict(hooks.snaps, peak=snapshot(tracker, "peak"))
    if buckets is not None:
        buckets.syncing(False)
    # FLOPs of one more micro-batch, outside the memory tracker: counting inside the tracked step changed the
    # memory the tracker saw for checkpointed blocks. One counter spans forward and backward, or the
    # recomputation goes unseen.
    vocab_parallel = loss_parallel if job.parallel.tp > 1 else contextlib.nullcontext
    with FlopCounterMode(display=False) as counter, vocab_parallel():
        with torch_precision(job.precision.mode).autocast("cpu"):
            loss = prog.model(*next(batches))
        loss.backward()
    prog.optimizer.zero_grad(set_to_none=True)
    snaps["flops"] = counter.get_total_flops()
    return snaps


@contextlib.contextmanager
def _gloo_reduce_scatter():
    """Reduce-scatters that hold what gloo holds: a clone of the input until the call returns (gloo has no
    reduce-scatter; torch's ProcessGroupGloo all-reduces a clone and copies this rank's chunk out). The fake
    process group moves nothing; with this it traces the CPU program as gloo ranks run it
    (toolkit.estimate.phases.gloo_copy)."""
    import torch.distributed.distributed_c10d as c10d

    plain = c10d.reduce_scatter_single

    def cloning(output, input, *args, **kwargs):
        clone = torch.empty_like(input)  # (a tensor the memory tracker sees, as it sees gloo's)
        work = plain(output, input, *args, **kwargs)
        del clone
        return work

    dist.reduce_scatter_single = c10d.reduce_scatter_single = cloning
    try:
        yield
    finally:
        dist.reduce_scatter_single = c10d.reduce_scatter_single = plain


@contextlib.contextmanager
def _fake_process_group(world_size: int, tp: int = 1, gloo: bool = False, replicas: int = 1, ep: int = 1):
    """A fake process group of `world_size` (× `tp`) ranks in this process: collectives return at once, moving
    nothing; with `gloo` its reduce-scatters hold what gloo's do (`_gloo_reduce_scatter`). With tp > 1 the mesh
    has two dimensions, "dp" and "tp"; with HSDP (`replicas` > 1) three, "dp_replicate", "dp_shard" and "tp";
    with expert parallelism (`ep` > 1) "edp", "ep" and "tp", edp × ep flattened as "dp": the runner's mesh of one
    pipeline stage, from the same builder (toolkit.program.mesh)."""
    if dist.is_initialized():
        raise SpecError(
            "parallel.dp",
            world_size,
            "a process group already exists in this process; trace FSDP layouts from a fresh process (toolkit trace)",
        )
    excepthook = sys.excepthook  # init_process_group wraps it to prefix "[rank0]:", once per call
    dist.init_process_group("fake", rank=0, world_size=world_size * tp, store=FakeStore())
    try:
        with _gloo_reduce_scatter() if gloo else contextlib.nullcontext():
            yield build_mesh(ParallelDims(dp=world_size, tp=tp, ep=ep, dp_replicate=replicas), "cpu")
    finally:
        dist.destroy_process_group()
        sys.excepthook = excepthook


def _trace_fsdp(job: Job) -> TraceResult:
    """ZeRO-2/3 as torch does them: FSDP2 `fully_shard` per block and at the root, on a fake process group;
    with tp > 1, over the dp dimension of a dp x tp mesh whose tp dimension holds the DTensor plan.

    fully_shard cannot run inside FakeTensorMode: the model is sharded on the meta device, then
    materialised as fake tensors with `to_empty`.

    With offload (`CPUOffloadPolicy`) FSDP2 keeps the sharded parameters, their gradients and the optimizer
    states in host memory and steps there; everything else is on the device. The CPU program has one memory,
    so the tracer counts FSDP's own categories for those states (and the step) as host bytes and the rest as
    the device's. Unlike a GPU, it makes no device copy of a shard before all-gathering it, nor of a
    reduce-scattered gradient before sending it to the host (each at most 1/dp of a block, briefly). Pinning
    changes where host memory is, not how much: fake tensors cannot be pinned, so the policy pins nothing.
    """
    par = job.parallel
    weights_dtype = TORCH_DTYPES[job.precision.plan.weights]
    offload = par.offload != "none"
    fake_group = _fake_process_group(
        par.dp, par.tp, gloo=job.memory.program == "cpu", replicas=par.dp_replicate, ep=par.ep
    )
    with fake_group as mesh:
        with torch.device("meta"):
            model = GPT(job.model, attention=job.memory.attention, recompute=job.memory.recompute, dtype=weights_dtype)
        if par.tp > 1:  # torchtitan's order: tensor parallelism inside each data-parallel shard
            tensor_parallel(model, mesh["tp"], sequence_parallel=par.sp)
        if par.ep > 1:
            expert_parallel(model, mesh["ep"])
        # the runner's own wrapping (toolkit.program.parallelize); fake tensors cannot be pinned
        apply_fsdp(model, job, fsdp_mesh(mesh, job), pin_memory=False, edp_mesh=mesh["edp"] if par.ep > 1 else None)
        with FakeTensorMode(allow_non_fake_inputs=True), _propagation_apart():
            model.to_empty(device="cpu")
            prog = _traced_program(job, model)
            tracker = FSDPDeviceTracker(model, prog.optimizer)
            if offload:
                tracker.host_bytes = fsdp_host_bytes
            snaps = _run_steps(job, tracker, prog)
    after, before, boundary = snaps["after"], snaps["before_step"], snaps["boundary"]
    on_device = 0 if offload else 1  # offload: the device keeps buffers only, the states are the host's
    return TraceResult(
        params_bytes=on_device * after.get("SHARDED_PARAM", 0) + after.get("BUFFER", 0),
        grads_bytes=on_device * before.get("SHARDED_GRAD", 0),
        optimizer_bytes=on_device * after.get("OPT", 0),
        activations_bytes=boundary.get("ACT", 0),
        peak_bytes=snaps["peak"].get("Device" if offload else "Total", 0),
        peak_breakdown=snaps["peak"],
        boundary_breakdown=boundary,
        flops_per_token=snaps["flops"] / (job.batch.micro_batch * job.model.seq_len),
        host_bytes=fsdp_host_bytes(before) if offload else 0,
        program="cpu, FSDP2 offload" if offload else "cpu",
    )
