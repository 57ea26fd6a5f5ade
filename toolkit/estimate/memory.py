"""Per-device memory of a training step: persistent states, saved activations and the peak.

Definitions (the CLI contract):
- params/grads/optimizer bytes: model states (toolkit.estimate.states);
- activations_bytes: what one micro-batch holds at the forward/backward boundary
  (toolkit.estimate.activations), the input batch included;
- peak_bytes: the largest total during a steady step (optimizer states already exist), over the moments where
  memory tops out in the runner's program (toolkit.estimate.phases: one function per moment).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..specs.backends import job_deepspeed_fp32
from ..specs.job import TORCH_SEMANTICS, Job
from .phases import optimizer_impl, stage_phases, stage_terms
from .states import StateBytes

__all__ = ["MemoryEstimate", "memory_estimate", "stage_memory_estimate", "memory_notes", "optimizer_impl"]


@dataclass(frozen=True)
class MemoryEstimate:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    host_bytes: float
    peak_bytes: float
    peak_phase: str
    """Which moment of the step holds the peak (see the module docstring)."""
    phases: dict[str, float] = field(default_factory=dict)
    states: StateBytes | None = None
    """The model states the figures above come from."""

    @property
    def states_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def memory_estimate(job: Job) -> MemoryEstimate:
    """The memory of a resolved job on its busiest device: with pipelining, the first stage (most
    micro-batches in flight, the embedding), the last (the head and the loss) or, with more than two
    stages, the second (a middle stage's buffers), whichever peaks higher."""
    pp = np.asarray(job.parallel.pp)
    if np.all(pp == 1):
        return _stage_memory(job, "first")
    # the last stage holds the head; with more than two stages, torch's schedules give the middle ones the most
    # receive buffers, and the second holds the most micro-batches of those (Megatron's program reuses its
    # buffers: with equal stages its second never holds more than the first, with uneven ones it may: 8 layers
    # × 15 micro-batches against the first's 7 × 16). All stages are evaluated in one pass, one per leading
    # index; ties go to the earlier one.
    names = ["first", "last"]
    uneven = job.parallel.stage_layers or np.any(job.model.layers % (pp * np.asarray(job.parallel.vpp)) != 0)
    if np.any(pp > 2) and (job.precision.mode in TORCH_SEMANTICS or uneven):
        names.append("second")
    stages = np.array(names).reshape((-1,) + (1,) * pp.ndim)
    each = _stage_memory(job, stages)
    shape = np.broadcast(stages, each.peak_bytes).shape
    eligible = np.broadcast_to((stages != "second") | (pp > 2), shape)
    busiest = np.where(eligible, np.broadcast_to(each.peak_bytes, shape), -np.inf).argmax(axis=0)

    # every number the estimate reports, stacked, so that one indexing picks the busiest stage's
    fields = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "host_bytes", "peak_bytes")
    state_fields = [f.name for f in dataclasses.fields(StateBytes)]
    values = (
        [getattr(each, f) for f in fields]
        + [getattr(each.states, f) for f in state_fields]
        + list(each.phases.values())
    )
    stacked = np.stack([np.broadcast_to(np.asarray(v, dtype=float), shape) for v in values])
    chosen = list(np.take_along_axis(stacked, busiest[None, None], axis=1)[:, 0])
    picked = dict(zip(fields, chosen[: len(fields)]))
    states = StateBytes(**dict(zip(state_fields, chosen[len(fields) : len(fields) + len(state_fields)])))
    phase = np.take_along_axis(np.broadcast_to(each.peak_phase, shape), busiest[None], axis=0)[0]
    return MemoryEstimate(
        **picked,
        peak_phase=phase,
        states=states,
        phases=dict(zip(each.phases, chosen[len(fields) + len(state_fields) :])),
    )


def stage_memory_estimate(job: Job, pp_rank: int) -> MemoryEstimate:
    """The memory of one pipeline rank of a resolved job (scalar layout): its first, last or a middle stage (which
    holds as many micro-batches in flight as stages follow it under 1F1B)."""
    pp = job.parallel.pp
    if pp == 1:
        return memory_estimate(job)
    if 0 < pp_rank < pp - 1:  # a middle stage: its blocks, and as many micro-batches as stages follow it
        return _stage_memory(job, "second", stages_after=pp - 1 - pp_rank)
    return _stage_memory(job, "first" if pp_rank == 0 else "last")


def _stage_memory(job: Job, stage, stages_after=None) -> MemoryEstimate:
    """One pipeline stage's memory ("first", "second" or "last", or an array of those names: one result per
    entry; without pipelining each is the whole model)."""
    terms = stage_terms(job, stage, stages_after)
    phases = stage_phases(terms)
    stacked = np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in phases.values())))
    phase = np.asarray(list(phases), dtype=object)[stacked.argmax(axis=0)]
    states, ds = terms.states, terms.held.ds
    # (DeepSpeed's ZeRO-2 partitions reach past their ranges: see zero_buffers.deepspeed_reduce)
    grads_bytes = np.where((ds.grads > 0) & ~np.asarray(ds.stage1), ds.partition, states.grads_bytes)
    return MemoryEstimate(
        params_bytes=states.params_bytes,
        grads_bytes=grads_bytes,
        optimizer_bytes=states.optimizer_bytes,
        activations_bytes=terms.acts.total,
        host_bytes=states.host_bytes,
        peak_bytes=stacked.max(axis=0),
        peak_phase=phase,
        phases=phases,
        states=states,
    )


def memory_notes(job: Job, mem: MemoryEstimate | None) -> list[str]:
    """What the memory figures assume, and what they leave out, in the words the CLI prints."""
    if mem is None:
        return ["activations need the model's shape (layers, hidden, heads): only model states are given"]
    notes = [
        f"memory follows the {job.memory.program} program of the runner's GPT "
        f"({job.memory.attention} attention, {optimizer_impl(job)} optimizer); peak at: {mem.peak_phase}"
    ]
    notes += _sharding_notes(job)
    notes += _grad_buffer_notes(job)
    notes += _pipeline_buffer_notes(job)
    notes += _compression_notes(job)
    return notes


def _sharding_notes(job: Job) -> list[str]:
    """Which program tensor parallelism and ZeRO/FSDP/DeepSpeed follow, and which combinations no trace checks yet."""
    par = job.parallel
    notes = []
    ds32 = bool(job_deepspeed_fp32(job))
    fsdp_traced = (
        job.precision.mode in TORCH_SEMANTICS
        and not ds32
        and par.zero in (2, 3)
        and (par.offload == "none" or par.tp == 1)
    )
    if par.tp > 1:
        notes.append(
            "tensor parallelism follows torch's DTensor program (toolkit.program.parallel): with sp the "
            "linears keep their all-gathered inputs, and the vocabulary-parallel loss and the embedding's "
            "backward hold more than Megatron's fused kernels"
        )
    combined_pp = par.pp > 1 and par.zero > 0
    deepspeed = (par.zero > 0 and job.precision.mode not in TORCH_SEMANTICS) or ds32
    deepspeed_traced = deepspeed and par.tp == 1 and par.pp == 1 and par.offload != "params"
    if combined_pp or (par.zero > 0 and not fsdp_traced and not deepspeed_traced) or (par.tp > 1 and par.zero == 1):
        notes.append(
            "offload with tp, DeepSpeed's parameter offload (ZeRO-Infinity), tp with ZeRO-1 or with "
            "DeepSpeed's ZeRO, and pp combined with ZeRO follow Megatron's and the frameworks' "
            "semantics and are not yet checked against a trace (replicas, torch's ZeRO-1/2/3 and FSDP2's "
            "CPU offload, DeepSpeed's ZeRO-1/2/3 with or without ZeRO-Offload, tp alone or inside FSDP2, "
            "and pipelines alone, interleaved or with tp are)"
        )
    if par.offload != "none" and fsdp_traced:
        notes.append(
            "FSDP2's CPU offload: sharded parameters, gradients and optimizer states in host memory, the "
            "step on the host; a GPU also copies each shard to the device before all-gathering it and "
            "each reduce-scattered gradient before sending it back (up to 1/dp of a block, briefly), "
            "which the CPU program and this estimate leave out"
        )
    if deepspeed:
        notes.append(_deepspeed_note(job))
    return notes


def _deepspeed_note(job: Job) -> str:
    """DeepSpeed's ZeRO as the tracer configures it: its bucket, ZeRO-3's prefetch, ZeRO-Offload's host copies."""
    par = job.parallel
    offload = (
        "; ZeRO-Offload keeps the fp32 partition, its gradient and the optimizer states on the host, "
        + (
            "the gradient partition there too"
            if par.zero == 3
            else "with a copy of the partition in the weights' dtype, and a buffer the size of the largest "
            "tensor on each side"
        )
        if par.offload == "optimizer"
        else ""
    )
    return (
        f"DeepSpeed's ZeRO-{par.zero} as toolkit.trace.zero.deepspeed_config(job) sets it up: reduce "
        f"bucket {job.training.bucket_cap_mb:g} MB (training.bucket_cap_mb; DeepSpeed's own default is "
        f"1 GB in 16-bit)" + (", one block gathered and one prefetched" if par.zero == 3 else "") + offload
    )


def _grad_buffer_notes(job: Job) -> list[str]:
    """Megatron-style fp32 main gradients, and whether a trace checks them for this layout."""
    if job.precision.grad_dtype != "fp32":
        return []
    par = job.parallel
    return [
        "fp32 main gradients as Megatron keeps them: one fp32 buffer from start-up, each 16-bit "
        "gradient added in and dropped"
        + (
            " (checked against a trace)"
            if par.zero == 0 and par.pp == 1 and par.tp == 1
            else "; with ZeRO, tp or pp not yet checked against a trace"
        )
    ]


def _pipeline_buffer_notes(job: Job) -> list[str]:
    """torch.distributed.pipelining's receive buffers, one per micro-batch, with their size on the busiest stage."""
    par = job.parallel
    if not (par.pp > 1 and par.schedule != "gpipe" and job.precision.mode in TORCH_SEMANTICS):
        return []
    m = job.grad_accum or 1
    stream_bytes = (
        job.batch.micro_batch
        * job.model.seq_len
        * job.model.hidden
        / (par.tp if par.sp else 1)
        * job.precision.plan.weight_bytes
    )
    per_stage_bytes = m * stream_bytes * (2 * par.vpp - 1 if par.pp == 2 else 2 * par.vpp)
    kept = " and keeps every tensor it sent until the step ends (as much again)" if par.vpp > 1 else ""
    return [
        f"pipeline stages follow torch.distributed.pipelining, which allocates a receive buffer for "
        f"each of the step's {m} micro-batches, per chunk and direction{kept}: "
        f"{per_stage_bytes * (2 if par.vpp > 1 else 1) / 2**30:.2f} GiB on the busiest stage here "
        f"(Megatron reuses a few); fewer, larger micro-batches shrink it"
    ]


def _compression_notes(job: Job) -> list[str]:
    """Compressed weights (QLoRA's NF4) and activations (int8): how they are counted and where they may miss."""
    notes = []
    if job.finetune.method == "qlora":
        notes.append(
            "QLoRA as toolkit.program.qlora runs it: NF4 with double quantization (bitsandbytes' layout, "
            "0.516 bytes a weight); its dequantizing matmul holds ~9 bytes per weight of one matrix at a "
            "time, bitsandbytes' CUDA kernels about 2"
        )
    if job.memory.act_compress == "int8":
        if job.memory.attention == "eager" or (job.model.dropout > 0 and job.memory.program == "cpu"):
            notes.append(
                "int8 with explicit attention ops: not modelled; activations and the peak read low, most at long "
                "sequences (the score matrices backward unpacks: -40 % at 1,024 tokens, benchmarks/"
                "memory_accuracy.py): measure it with `toolkit trace`"
            )
        else:
            notes.append("int8 activations as the runner packs them (blocks only, 1 + 4/128 bytes a value)")
    return notes
