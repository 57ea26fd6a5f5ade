"""The terms one pipeline stage's memory moments are sums of (toolkit.estimate.phases), computed once per job:
what persists through the step by framework, the gradients as backward makes them, FSDP2's and ZeRO-3's gathered
parameters, and the temporaries of single moments. numpy arrays over layouts, or plain numbers for one job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.backends import job_deepspeed_fp32
from ..specs.job import TORCH_SEMANTICS, Job
from .activations import ActivationBytes, activation_bytes, element_bytes
from .moe import device_counts, expert_load, mlp_width, moe_temp_width
from .params import ParamCount
from .states import (
    StateBytes,
    adapter_params_per_layer,
    bf16_optimizer,
    bytes_per_param,
    job_params_per_device,
    model_state_bytes,
    vocab_per_rank,
)
from .zero_buffers import Gathered, Reduce, accumulated_grad_bytes, deepspeed_reduce, gathered_params, pipelined_fsdp

__all__ = ["StageTerms", "stage_terms", "optimizer_impl", "ddp_buckets", "trainable_per_device", "degrees"]


@dataclass(frozen=True)
class Position:
    """Where the stage sits in the pipeline and the step (arrays over layouts)."""

    single: object  # no pipelining
    owns_head: object  # holds the output projection and the loss
    owns_embedding: object  # holds the token embedding
    micro_batches: object  # per optimizer step
    accumulating: object  # more than one micro-batch per step (pipelining included)
    forwards_first: object  # every forward runs before any backward (GPipe; 1F1B whose warm-up covers the step)


@dataclass(frozen=True)
class Held:
    """What stays allocated through the step, and the gradients on top of it."""

    persistent: object  # weights, optimizer states and any buffer kept from start-up
    grads_full: object  # gradients at the end of backward that are not in `persistent`
    step_grads: object  # the gradients the optimizer step sees beside `persistent`
    grad_b: object  # bytes per gradient element
    main_grads: object  # Megatron's fp32 main-gradient buffer is in `persistent`
    no_growth: object  # gradients land in a buffer that already exists
    ds: Reduce  # DeepSpeed's reduce buffers (zeros elsewhere)


@dataclass(frozen=True)
class Gradients:
    """Gradients as backward makes them: head first, then layer by layer, embedding last."""

    per_layer_trainable: object
    layer_grad: object  # one block's, as the rank keeps it
    head_grad: object  # the head's (and the final norm's), unsharded until FSDP2's post-backward
    unsharded_grad_b: object  # bytes per element of a gradient before FSDP2 shards it
    grads_before: object  # made by earlier micro-batches of the step
    grads_prev: object  # of those, still held when this micro-batch runs


@dataclass(frozen=True)
class Temporaries:
    """Tensors that live for one moment of the step."""

    tokens: object
    ffn: object  # this rank's FFN width
    mlp_temp: object  # the MLP's backward beyond what it held
    vocab_parallel: object  # torch's vocabulary-parallel loss (tp > 1, torch semantics)
    logits_grads: object  # the loss's backward
    logits_bytes: object  # the logits and their fp32 copy, end of forward
    unpacked: object  # int8: the MLP's inner tensors unpacked to full size in backward
    autocast_cache: object  # autocast's cached 16-bit weight casts (full recompute)
    step_cache: object  # the same through backward, inside a pipeline schedule's one autocast context
    dequant_bytes: object  # QLoRA: one matrix being dequantized
    recompute_dequant: object  # the same, inside backward (full recompute rebuilds the block)
    experts_freed: object = 0.0  # an MoE block: what its backward frees before its routed experts' (see below)


@dataclass(frozen=True)
class StageTerms:
    """Everything the moments of one stage's step are built from."""

    job: Job
    stage: object  # "first" | "second" | "last", or an array of those
    states: StateBytes
    acts: ActivationBytes
    counts: ParamCount
    gathered: Gathered  # FSDP2's and ZeRO-3's gathered parameters
    position: Position
    held: Held
    grads: Gradients
    temps: Temporaries


def optimizer_impl(job: Job) -> str:
    """The optimizer implementation: the Job's choice, else torch's default (foreach on CUDA, for-loop on CPU)."""
    if job.optimizer.impl is not None:
        return job.optimizer.impl
    return "for-loop" if job.memory.program == "cpu" else "foreach"


def ddp_buckets(job: Job):
    """Where the runner wraps the model in torch's DDP, whose gradient buckets persist: the torch backend's
    replicas and ZeRO-1 over more than one dp rank, tp and pp 1 (dp × tp and pipelines average by hand; fp32 main
    gradients too). Arrays in, arrays out (layout grids)."""
    par = job.parallel
    zero, dp = np.asarray(par.zero), np.asarray(1 if par.dp is None else par.dp)
    torch_backend = ((job.precision.mode in TORCH_SEMANTICS) & ~job_deepspeed_fp32(job)) | (zero == 0)  # (else
    # DeepSpeed's: mixed-* with ZeRO, or fp32 where parallel.backend names it)
    plain = (np.asarray(par.tp) == 1) & (np.asarray(par.pp) == 1) & (np.asarray(par.ep) == 1)  # (ep: by hand too)
    return torch_backend & (dp > 1) & (zero <= 1) & plain


def degrees(job: Job):
    """(tp, the data-parallel degree ZeRO shards over, zero) as arrays: dp, or under HSDP dp / dp_replicate."""
    par = job.parallel
    dp = np.asarray(1 if par.dp is None else par.dp)
    return np.asarray(par.tp), np.maximum(dp // np.asarray(par.dp_replicate), 1), np.asarray(par.zero)


def trainable_per_device(job: Job, stage: str | None = None):
    """Parameters the optimizer steps on one device (before ZeRO sharding): all, or LoRA's adapters."""
    par = job.parallel
    if job.finetune.adapters:
        return adapter_params_per_layer(job) * (job.model.layers // np.asarray(par.pp)) / np.asarray(par.tp)
    return job_params_per_device(job, stage)


def _position(job: Job, stage, acts: ActivationBytes) -> Position:
    single = np.asarray(job.parallel.pp) == 1
    micro_batches = np.asarray(1 if job.grad_accum is None else job.grad_accum)
    # GPipe runs every forward before any backward, and so does 1F1B on a stage whose warm-up covers all the
    # step's micro-batches: no gradient exists while the activations pile up
    return Position(
        single=single,
        owns_head=single | (stage == "last"),
        owns_embedding=single | (stage == "first"),
        micro_batches=micro_batches,
        accumulating=micro_batches > 1,
        forwards_first=~single & (acts.in_flight >= micro_batches),
    )


def _held(job: Job, stage, states: StateBytes, counts: ParamCount, where: Position) -> Held:
    """What persists, by framework: DeepSpeed's buffers, Megatron's fp32 main gradients, DeepSpeed's BF16
    optimizer and DDP's buckets each move some gradients into buffers that exist from start-up."""
    tp, dp, zero = degrees(job)
    _w, grad_b, _o = bytes_per_param(job)
    persistent = states.params_bytes + states.optimizer_bytes
    grads_full = states.grads_bytes
    ds = deepspeed_reduce(
        job,
        trainable_per_device(job, stage),
        grad_b,
        dp,
        ends=(np.where(where.owns_embedding, counts.embedding, 0) / tp, np.where(where.owns_head, counts.head, 0) / tp),
    )
    persistent = persistent + ds.fixed + ds.staging
    grads_full = np.where(ds.fixed > 0, 0.0, grads_full)  # (DeepSpeed's ZeRO-3: counted in persistent)
    # Megatron's fp32 main gradients: one buffer allocated at start-up and zeroed, never freed, so it is there in
    # forward too; each 16-bit gradient is added into it as autograd makes it, and dropped
    bf16_opt = bf16_optimizer(job)
    main_grads = job.precision.plan.master_weights & (job.precision.grad_dtype == "fp32") & (zero == 0) & ~bf16_opt
    persistent = persistent + np.where(main_grads, grads_full, 0.0)
    grads_full = np.where(main_grads, 0.0, grads_full)
    # DeepSpeed's BF16 optimizer: its fp32 buffer (4 of the 6 bytes) is made at start-up; the bf16 gradients
    # appear in backward as usual and are added into it after each micro-batch
    persistent = persistent + np.where(bf16_opt, grads_full * 4 / 6, 0.0)
    grads_full = np.where(bf16_opt, grads_full * 2 / 6, grads_full)
    grad_b = np.where(bf16_opt, 2, grad_b)
    # DDP (torch's replicas, and under torch's ZeRO-1): its gradient buckets are allocated once and kept, and each
    # gradient, once reduced, is a view into them (gradient_as_bucket_view). Without accumulation the buckets are
    # the gradients, there in forward too (as a main-gradient buffer); when accumulating, the micro-batches before
    # the last (no_sync) add into ordinary gradients beside them, which the last one's reduction copies in.
    bucketed = ddp_buckets(job) & ~main_grads
    bucket_is_grads = bucketed & ~where.accumulating
    persistent = persistent + np.where(bucketed, grads_full, 0.0)
    step_grads = np.where(bucketed, 0.0, grads_full)  # by the step every gradient is a bucket's view
    grads_full = np.where(bucket_is_grads, 0.0, grads_full)
    # FSDP2 under a pipeline schedule keeps the stage's gradients whole until the step's last backward; the step
    # then sees their shards
    grads_full = np.where(
        pipelined_fsdp(job), trainable_per_device(job, stage) * accumulated_grad_bytes(job), grads_full
    )
    return Held(
        persistent=persistent,
        grads_full=grads_full,
        step_grads=step_grads,
        grad_b=grad_b,
        main_grads=main_grads,
        no_growth=main_grads | bucket_is_grads,
        ds=ds,
    )


def _gradients(
    job: Job, stage, acts: ActivationBytes, counts: ParamCount, gathered: Gathered, where: Position, held: Held
) -> Gradients:
    tp, dp, zero = degrees(job)
    par, lora, ds = job.parallel, job.finetune.adapters, held.ds
    per_layer_trainable = adapter_params_per_layer(job) if lora else counts.per_layer
    piped = pipelined_fsdp(job)
    layer_grad = np.where(
        held.no_growth,
        0.0,
        per_layer_trainable
        / tp
        * np.where(piped, accumulated_grad_bytes(job), held.grad_b / np.where(zero >= 2, dp, 1)),
    )
    # FSDP2's CPU offload moves each block's sharded gradient to the host once reduce-scattered: none stays
    layer_grad = np.where((gathered.reduce_scatter > 0) & (np.asarray(par.offload) != "none"), 0.0, layer_grad)
    head_param = np.where(
        where.owns_head, 0 if lora else (counts.head if counts.head else counts.embedding), 0
    )  # tied: at the head
    # FSDP2 computes gradients on the gathered (16-bit) weights and shards them at each module's post-backward:
    # the root's (head) until the end of backward, a block's until the block is done
    unsharded_grad_b = np.where(
        (gathered.reduce_scatter > 0) | held.main_grads | piped, job.precision.plan.compute_bytes, held.grad_b
    )
    head_grad = np.where(
        held.no_growth,
        0.0,
        (head_param + np.where(where.owns_head & (not lora), counts.final, 0)) * unsharded_grad_b / tp,
    )
    # gradients made by earlier micro-batches of the step; interleaved over one round (m <= p) the last stage
    # runs every backward of its head chunk before any of its other chunks'
    one_round = (np.asarray(par.vpp) > 1) & (where.micro_batches // np.asarray(par.pp) <= 1) & (stage == "last")
    grads_before = np.where(
        one_round, head_grad + layer_grad * acts.stage_layers / np.asarray(par.vpp), held.grads_full
    )
    # DeepSpeed's ZeRO-1 reduces at the step's end (and its bucket, once made, stays until then); ZeRO-2 into its
    # partition at every micro-batch
    grads_before = np.select([ds.stage1, ds.grads > 0], [ds.grads, ds.partition], grads_before)
    grads_prev = np.where(
        where.accumulating & ~where.forwards_first, grads_before + np.where(ds.stage1, ds.bucket, 0.0), 0.0
    )
    return Gradients(
        per_layer_trainable=per_layer_trainable,
        layer_grad=layer_grad,
        head_grad=head_grad,
        unsharded_grad_b=unsharded_grad_b,
        grads_before=grads_before,
        grads_prev=grads_prev,
    )


def _temporaries(job: Job, acts: ActivationBytes, gathered: Gathered, where: Position) -> Temporaries:
    model, par, plan = job.model, job.parallel, job.precision.plan
    tp = np.asarray(par.tp)
    h, vocab = model.hidden, vocab_per_rank(model, tp)
    tokens = np.asarray(job.batch.micro_batch) * model.seq_len / par.cp  # this rank's share under context parallelism
    tokens_h = np.where(par.sp, tokens / tp, tokens)
    act, residual = plan.compute_bytes, element_bytes(job)[1]  # (FSDP2 under amp-* casts each block's input to 16-bit)
    # Backward of the MLP, beyond what it held: the incoming gradient, and the gradients of its
    # inner tensors alive together (GELU: one net of the freed input; SwiGLU: two at the product)
    ffn = mlp_width(job, expert_load(model, par.ep, for_memory=True))
    # an MoE block's backward runs the weighted combine and the shared experts first (made last in forward): their
    # saved tensors are gone when the routed experts' backward, the wider, runs (traced per module: the top block's
    # MLP backward peaks where it starts)
    load = expert_load(model, par.ep, for_memory=True)
    temp_width = ffn if not model.experts else moe_temp_width(model, load)
    experts_freed = 0.0
    if model.experts:  # (under FSDP2 the experts are their own unit, whose hooks order the backward otherwise)
        shared = model.shared_experts * model.shared_expert_ffn_
        inner = (4 if model.mlp == "swiglu" else 2) * tokens * shared * element_bytes(job)[0]
        experts_freed = tokens * model.experts_per_token * h * element_bytes(job)[0] + inner
    # (sequence parallelism: the gradient of the all-gathered input is whole until it is reduce-scattered)
    mlp_temp = (
        (2 if model.mlp == "swiglu" else 1) * tokens * temp_width * act
        + tokens_h * h * residual
        + np.where(par.sp, tokens * h * residual, 0.0)
    )
    # the loss's backward: the fp32 gradient of the logits and of their log-softmax; torch's vocabulary-parallel
    # loss (tp > 1, toolkit.program.parallel) builds it from three fp32 temporaries, and its forward holds the
    # shifted logits beside the log-softmax. mixed-* modes follow Megatron's program (DeepSpeed's for ZeRO),
    # whose fused kernel holds no more than the plain loss.
    vocab_parallel = (tp > 1) & (job.precision.mode in TORCH_SEMANTICS)  # mixed-*: Megatron's fused kernel
    # int8 saved activations: backward unpacks the MLP's inner tensors to full size next to their gradients
    # (explicit attention's unpacked score matrices: not modelled yet)
    unpacked = (2 if model.mlp == "swiglu" else 1) * tokens * ffn * act if job.memory.act_compress == "int8" else 0.0
    # End of forward, inside the loss: the logits (16-bit under autocast or 16-bit weights) and their fp32
    # copy are alive beside the log-softmax; under autocast its cache still holds the blocks' 16-bit weight
    # casts, which full (and per-op) recompute does not otherwise keep.
    q, kv = model.heads * model.head_dim_, model.kv_heads_ * model.head_dim_
    layer_matmuls = 2 * h * q + 2 * h * kv + (3 if model.mlp == "swiglu" else 2) * h * model.ffn_
    if job.finetune.adapters:  # autocast caches casts of trainable leaves only: the adapters
        layer_matmuls = adapter_params_per_layer(job)
    caching = (
        (plan.family == "amp")
        & np.isin(job.memory.recompute, ("full", "selective-op"))
        & (gathered.root == 0)
        & (gathered.in_backward == 0)
    )
    autocast_cache = np.where(caching, 2 * acts.stage_layers * layer_matmuls / tp, 0.0)  # head's cast is saved
    # QLoRA: the top block's down projection, forward: its weight being dequantized, with the unpacked indices
    # (1 byte), their int32 copy for the table lookup and the looked-up levels (toolkit.program.qlora); under full
    # recompute the same happens inside backward, while the block is rebuilt
    dequant = (1 + 4 + 2 + 2) * h * model.ffn_ if job.finetune.method == "qlora" else 0.0
    return Temporaries(
        tokens=tokens,
        ffn=ffn,
        mlp_temp=mlp_temp,
        vocab_parallel=vocab_parallel,
        logits_grads=np.where(vocab_parallel, 3, 2) * tokens * vocab * 4,
        logits_bytes=tokens * vocab * ((4 if plan.family == "fp32" else 2 + 4) + np.where(vocab_parallel, 4, 0)),
        unpacked=unpacked,
        autocast_cache=autocast_cache,
        step_cache=np.where(where.single, 0.0, autocast_cache),  # a pipeline schedule runs in one autocast context
        dequant_bytes=dequant,
        recompute_dequant=np.where(np.asarray(job.memory.recompute) == "full", dequant, 0.0) if dequant else 0.0,
        experts_freed=np.where((gathered.in_backward > 0) | (gathered.blocks > 0), 0.0, experts_freed),
    )


def stage_terms(job: Job, stage, stages_after=None) -> StageTerms:
    """The terms of one pipeline stage ("first", "second" or "last", or an array of those; without pipelining each
    is the whole model)."""
    states = model_state_bytes(job, stage)
    acts = activation_bytes(job, stage, stages_after)
    counts = device_counts(job.model, np.asarray(job.parallel.ep) * job.parallel.etp)  # (1 / (ep · etp) of the experts)
    where = _position(job, stage, acts)
    gathered = gathered_params(job, counts, acts.stage_layers, where.owns_embedding, where.owns_head)
    held = _held(job, stage, states, counts, where)
    return StageTerms(
        job=job,
        stage=stage,
        states=states,
        acts=acts,
        counts=counts,
        gathered=gathered,
        position=where,
        held=held,
        grads=_gradients(job, stage, acts, counts, gathered, where, held),
        temps=_temporaries(job, acts, gathered, where),
    )
