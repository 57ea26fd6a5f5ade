"""Per-device memory of a training step: persistent states, saved activations and the peak.

Definitions (the CLI contract):
- params/grads/optimizer bytes: model states (toolkit.estimate.states);
- activations_bytes: what one micro-batch holds at the forward/backward boundary
  (toolkit.estimate.activations), the input batch included;
- peak_bytes: the largest total during a steady step (optimizer states already exist).

The peak is the largest of the moments where memory tops out in the runner's program:
- `loss`: the boundary plus the two fp32 logit-sized gradients of the cross-entropy;
- `top layer` and `bottom layer` of the backward pass: activations still held, gradients
  made so far, and the layer's backward temporaries (the recomputed block under full
  recompute). Activations shrink and gradients grow linearly across layers, so the
  largest total sits at one of the two ends (under FSDP2, which reduce-scatters each block's
  gradients while the next one runs and prefetches no block below the bottom one, also at the
  `layer below the top` or the `layer above the bottom`);
- `optimizer step`: all gradients plus the optimizer's temporaries (for-loop: two copies of
  the largest tensor; foreach: one copy of every state tensor; fused: none) and, for
  `mixed-*`, the fp32 copies of the gradients the master weights are stepped with;
- `embedding backward` (tensor parallelism): all gradients and the token embedding's
  unsharded gradient, which torch's DTensor backward builds before the rank keeps its rows.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from ..specs.job import TORCH_SEMANTICS, Job
from .activations import activation_bytes, element_bytes
from .params import count_params
from .states import (StateBytes, adapter_params_per_layer, bf16_optimizer, bytes_per_param, job_stage_layers, model_state_bytes,
                     params_per_device, vocab_per_rank)
from .zero_buffers import deepspeed_reduce, gathered_params, largest_matrix

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


def optimizer_impl(job: Job) -> str:
    """The optimizer implementation: the Job's choice, else torch's default (foreach on CUDA, for-loop on CPU)."""
    if job.optimizer.impl is not None:
        return job.optimizer.impl
    return "for-loop" if job.memory.program == "cpu" else "foreach"


def _optimizer_temp_bytes(job: Job, largest_param: float, stage: str | None = None) -> float:
    """Temporaries of one optimizer step, in bytes."""
    name, impl = job.optimizer.name, optimizer_impl(job)
    if name in ("sgd", "adamw-8bit") or impl == "fused":     # (bitsandbytes updates its 8-bit states in place)
        return 0.0
    par = job.parallel
    zero, dp = np.asarray(par.zero), np.asarray(1 if par.dp is None else par.dp)
    state = 2 if job.precision.mode == "pure-bf16" else 4
    shard = np.where(zero >= 1, dp, 1)                       # the optimizer steps this rank's shard only
    n = _trainable_per_device(job, stage) / shard
    if impl == "foreach":
        return n * state                                     # sqrt(v) for every tensor at once
    # ZeroRedundancyOptimizer (torch ZeRO-1) gives whole tensors to ranks; FSDP2 and DeepSpeed split them
    split = np.where((zero >= 2) | ((zero == 1) & job.precision.mode.startswith("mixed-")), dp, 1)
    return 2 * largest_param / split * state                 # sqrt(v) and its scaled copy, one tensor at a time


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
    values = ([getattr(each, f) for f in fields] + [getattr(each.states, f) for f in state_fields]
              + list(each.phases.values()))
    stacked = np.stack([np.broadcast_to(np.asarray(v, dtype=float), shape) for v in values])
    chosen = list(np.take_along_axis(stacked, busiest[None, None], axis=1)[:, 0])
    picked = dict(zip(fields, chosen[:len(fields)]))
    states = StateBytes(**dict(zip(state_fields, chosen[len(fields):len(fields) + len(state_fields)])))
    phase = np.take_along_axis(np.broadcast_to(each.peak_phase, shape), busiest[None], axis=0)[0]
    return MemoryEstimate(**picked, peak_phase=phase, states=states,
                          phases=dict(zip(each.phases, chosen[len(fields) + len(state_fields):])))


def ddp_buckets(job: Job):
    """Where the runner wraps the model in torch's DDP, whose gradient buckets persist: the torch backend's
    replicas and ZeRO-1 over more than one dp rank, tp and pp 1 (dp × tp and pipelines average by hand; fp32 main
    gradients too). Arrays in, arrays out (layout grids)."""
    par = job.parallel
    zero, dp = np.asarray(par.zero), np.asarray(1 if par.dp is None else par.dp)
    torch_backend = (job.precision.mode in TORCH_SEMANTICS) | (zero == 0)    # (mixed-* with ZeRO: DeepSpeed's)
    return torch_backend & (dp > 1) & (zero <= 1) & (np.asarray(par.tp) == 1) & (np.asarray(par.pp) == 1)


def stage_memory_estimate(job: Job, pp_rank: int) -> MemoryEstimate:
    """The memory of one pipeline rank of a resolved job (scalar layout): its first, last or a middle stage (which
    holds as many micro-batches in flight as stages follow it under 1F1B)."""
    pp = job.parallel.pp
    if pp == 1:
        return memory_estimate(job)
    if 0 < pp_rank < pp - 1:           # a middle stage: its blocks, and as many micro-batches as stages follow it
        return _stage_memory(job, "second", stages_after=pp - 1 - pp_rank)
    return _stage_memory(job, "first" if pp_rank == 0 else "last")


def _stage_memory(job: Job, stage, stages_after=None) -> MemoryEstimate:
    """One pipeline stage's memory ("first", "second" or "last", or an array of those names: one result per
    entry; without pipelining each is the whole model)."""
    states = model_state_bytes(job, stage)
    acts = activation_bytes(job, stage, stages_after)
    model, par = job.model, job.parallel
    single = np.asarray(par.pp) == 1
    owns_head = single | (stage == "last")
    # GPipe runs every forward before any backward, and so does 1F1B on a stage whose warm-up covers all the
    # step's micro-batches: no gradient exists while the activations pile up
    micro_batches = np.asarray(1 if job.grad_accum is None else job.grad_accum)
    forwards_first = ~single & (acts.in_flight >= micro_batches)          # (GPipe: always)
    mode = job.precision.mode
    counts = count_params(model)
    _w, grad_b, _o = bytes_per_param(job)
    tp, dp, zero = np.asarray(par.tp), np.asarray(1 if par.dp is None else par.dp), np.asarray(par.zero)
    h, vocab = model.hidden, vocab_per_rank(model, tp)
    tokens = np.asarray(job.batch.micro_batch) * model.seq_len / par.cp    # this rank's share under context parallelism
    tokens_h = np.where(par.sp, tokens / tp, tokens)
    act = 4 if mode == "fp32" else 2
    residual = element_bytes(job)[1]          # (FSDP2 under amp-* casts each block's input to 16-bit)
    accumulating = np.asarray(1 if job.grad_accum is None else job.grad_accum) > 1             # also: pipelining over several micro-batches
    persistent = states.params_bytes + states.optimizer_bytes
    grads_full = states.grads_bytes
    gathered = gathered_params(job, counts)
    reduce_scatter = gathered.reduce_scatter
    owns_embedding = single | (stage == "first")
    ds = deepspeed_reduce(job, _trainable_per_device(job, stage), grad_b, dp,
                           ends=(np.where(owns_embedding, counts.embedding, 0) / tp,
                                 np.where(owns_head, counts.head, 0) / tp))
    persistent = persistent + ds.fixed + ds.staging
    grads_full = np.where(ds.fixed > 0, 0.0, grads_full)          # (DeepSpeed's ZeRO-3: counted in persistent)
    # Megatron's fp32 main gradients: one buffer allocated at start-up and zeroed, never freed, so it is there in
    # forward too; each 16-bit gradient is added into it as autograd makes it, and dropped
    bf16_opt = bf16_optimizer(job)
    main_grads = mode.startswith("mixed-") & (job.precision.grad_dtype == "fp32") & (zero == 0) & ~bf16_opt
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
    bucket_is_grads = bucketed & ~accumulating
    persistent = persistent + np.where(bucketed, grads_full, 0.0)
    step_grads = np.where(bucketed, 0.0, grads_full)            # by the step every gradient is a bucket's view
    grads_full = np.where(bucket_is_grads, 0.0, grads_full)
    no_growth = main_grads | bucket_is_grads                    # gradients land in a buffer that already exists

    # gradients appear during backward: head first, then layer by layer, embedding last
    lora = job.finetune.adapters
    per_layer_trainable = adapter_params_per_layer(job) if lora else counts.per_layer
    layer_grad = np.where(no_growth, 0.0, per_layer_trainable * grad_b / tp / np.where(zero >= 2, dp, 1))
    head_param = np.where(owns_head, 0 if lora else (counts.head if counts.head else counts.embedding), 0)  # tied: at the head
    # FSDP2 computes gradients on the gathered (16-bit) weights and shards them at each module's post-backward:
    # the root's (head) until the end of backward, a block's until the block is done
    unsharded_grad_b = np.where((reduce_scatter > 0) | main_grads, 4 if mode == "fp32" else 2, grad_b)
    head_grad = np.where(no_growth, 0.0,
                         (head_param + np.where(owns_head & (not lora), counts.final, 0)) * unsharded_grad_b / tp)
    # gradients made by earlier micro-batches of the step; interleaved over one round (m <= p) the last stage
    # runs every backward of its head chunk before any of its other chunks'
    one_round = (np.asarray(par.vpp) > 1) & (micro_batches // np.asarray(par.pp) <= 1) & (stage == "last")
    grads_before = np.where(one_round, head_grad + layer_grad * acts.stage_layers / np.asarray(par.vpp), grads_full)
    # DeepSpeed's ZeRO-1 reduces at the step's end (and its bucket, once made, stays until then); ZeRO-2 into its
    # partition at every micro-batch
    grads_before = np.select([ds.stage1, ds.grads > 0], [ds.grads, ds.partition], grads_before)
    grads_prev = np.where(accumulating & ~forwards_first, grads_before + np.where(ds.stage1, ds.bucket, 0.0), 0.0)

    # Backward of the MLP, beyond what it held: the incoming gradient, and the gradients of its
    # inner tensors alive together (GELU: one net of the freed input; SwiGLU: two at the product)
    ffn = model.ffn_ / tp
    # (sequence parallelism: the gradient of the all-gathered input is whole until it is reduce-scattered)
    mlp_temp = ((2 if model.mlp == "swiglu" else 1) * tokens * ffn * act + tokens_h * h * residual
                + np.where(par.sp, tokens * h * residual, 0.0))
    # the loss's backward: the fp32 gradient of the logits and of their log-softmax; torch's vocabulary-parallel
    # loss (tp > 1, toolkit.train.parallel) builds it from three fp32 temporaries, and its forward holds the
    # shifted logits beside the log-softmax. mixed-* modes follow Megatron's program (DeepSpeed's for ZeRO),
    # whose fused kernel holds no more than the plain loss.
    vocab_parallel = (tp > 1) & (mode in TORCH_SEMANTICS)      # mixed-*: Megatron's fused kernel
    logits_grads = np.where(vocab_parallel, 3, 2) * tokens * vocab * 4

    # int8 saved activations: backward unpacks the MLP's inner tensors to full size next to their gradients,
    # and forward holds the block's full-size MLP tensors beside the compressed ones until each is packed
    int8 = job.memory.act_compress == "int8"
    mlp_full = (2 if model.mlp == "swiglu" else 1) * tokens * ffn * act
    unpacked = mlp_full if int8 else 0.0     # (explicit attention's unpacked score matrices: not modelled yet)

    # End of forward, inside the loss: the logits (16-bit under autocast or 16-bit weights) and their fp32
    # copy are alive beside the log-softmax; under autocast its cache still holds the blocks' 16-bit weight
    # casts, which full recompute does not otherwise keep.
    logits_bytes = tokens * vocab * ((4 if mode == "fp32" else 2 + 4) + np.where(vocab_parallel, 4, 0))
    q, kv = model.heads * model.head_dim_, model.kv_heads_ * model.head_dim_
    layer_matmuls = 2 * h * q + 2 * h * kv + (3 if model.mlp == "swiglu" else 2) * h * model.ffn_
    if job.finetune.adapters:                 # autocast caches casts of trainable leaves only: the adapters
        layer_matmuls = adapter_params_per_layer(job)
    caching = (mode.startswith("amp-") & (np.asarray(job.memory.recompute) == "full")
               & (gathered.root == 0) & (gathered.in_backward == 0))
    autocast_cache = np.where(caching, 2 * acts.stage_layers * layer_matmuls / tp, 0.0)   # head's cast is saved
    last = persistent + grads_prev + acts.total + gathered.blocks + gathered.root + gathered.at_loss
    # a pipeline schedule runs inside one autocast context: its cache lives through the backward too
    step_cache = np.where(single, 0.0, autocast_cache)
    phases = {"forward end": last + np.where(owns_head, logits_bytes, 0.0) + autocast_cache + gathered.forward_tail,
              "loss": last + np.where(owns_head, logits_grads, 0.0) + step_cache}
    if int8:
        phases["top layer forward"] = (persistent + grads_prev + acts.layers + acts.embedding + gathered.blocks
                                       + gathered.root + (3 if model.mlp == "swiglu" else 2) * tokens * ffn * act)

    after_head = acts.total - acts.head                            # loss and final norm have released theirs
    dequant = 0.0
    if job.finetune.method == "qlora":
        # the top block's down projection, forward: its weight being dequantized, with the unpacked indices
        # (1 byte), their int32 copy for the table lookup and the looked-up levels (toolkit.train.qlora);
        # under full recompute the same happens inside backward, while the block is rebuilt
        dequant = (1 + 4 + 2 + 2) * h * model.ffn_
        phases["top layer forward"] = persistent + grads_prev + acts.layers + acts.embedding + dequant
        dequant = np.where(np.asarray(job.memory.recompute) == "full", dequant, 0.0)
    # FSDP2: below the top block, the block above is still reduce-scattering, and ZeRO-3 prefetches the next
    # block during each block's backward but the bottom one's; the totals are linear between those changes,
    # so the layer below the top and the one above the bottom are candidates too
    for name, done_layers in (("top layer", 0), ("layer below the top", np.minimum(acts.stage_layers - 1, 1)),
                              ("layer above the bottom", np.maximum(acts.stage_layers - 2, 0)),
                              ("bottom layer", acts.stage_layers - 1)):
        if (name == "layer below the top" and not np.any(reduce_scatter)) or \
                (name == "layer above the bottom" and not np.any(gathered.prefetch)):
            continue
        # by the MLP's backward, the layer has made its down-projection's weight gradient too; when
        # accumulating, that gradient is a temporary (in the compute dtype, then cast) added into .grad
        if lora:                                                    # only an adapter on down has a gradient
            down_grad = job.finetune.rank * (ffn + h) * grad_b * ("down" in job.finetune.targets)
        else:
            down_grad = h * ffn * unsharded_grad_b
        made = head_grad + done_layers * layer_grad
        # DeepSpeed's ZeRO-2 copies each gradient into its bucket, and the bucket, when full, into the partition
        whole = head_grad + done_layers * per_layer_trainable * grad_b / tp
        made = np.where(ds.bucket > 0, np.where(ds.stage1, whole, ds.flushed(whole) * ds.partition), made) + ds.bucket
        made = np.where(ds.fixed > 0, 0.0, made)                  # ZeRO-3: straight into its bucket
        # accumulating: earlier micro-batches' gradients, plus the new ones not yet added in (replicas: the down
        # projection's, and under autocast its 16-bit original beside the fp32 cast; FSDP2: also the root's whole
        # 16-bit head gradient, reduce-scattered only at the end of backward)
        adding = np.where(reduce_scatter > 0, head_grad, h * ffn * 2 if mode.startswith("amp-") else 0)
        grads = np.where(accumulating & ~forwards_first, grads_before + ds.bucket + down_grad + adding,
                         made + down_grad)
        if name == "bottom layer":      # a full bucket being reduced meanwhile: flattened again (errs high by that)
            grads = grads + np.where(ds.grads > ds.bucket, ds.flat_copy, 0.0)
        held = after_head - done_layers * acts.freed_per_layer          # one micro-batch goes backward at a time
        still_gathered = gathered.blocks * (1 - done_layers / np.maximum(acts.stage_layers, 1))
        in_backward = gathered.in_backward - (gathered.prefetch if name == "bottom layer" else 0.0)
        base = persistent + grads + still_gathered + gathered.root + in_backward
        # below the top block, the block above is still reduce-scattering its gradients (FSDP2 overlaps them)
        overlap = np.where(np.asarray(done_layers) > 0, reduce_scatter, 0.0)
        # (QLoRA rebuilding a block: its dequantizing moment counted on top, which errs 4-6 % high)
        phases[name] = base + held + acts.recompute_layer + mlp_temp + overlap + unpacked + step_cache + dequant
        if name == "top layer":
            # the top block's post-backward: its activations are gone, it is resharded, and its unsharded
            # gradients are copied into the reduce-scatter input (FSDP2 only; 0 elsewhere)
            block_grads = counts.per_layer / tp * unsharded_grad_b
            resharded = np.where(gathered.blocks > 0, gathered.block, 0.0)
            phases["top layer reduce-scatter"] = np.where(
                reduce_scatter > 0,
                base - down_grad - resharded + held - acts.freed_per_layer + block_grads + reduce_scatter,
                0.0)

    # The token embedding's backward, last: when accumulating, its new gradient is a temporary beside .grad
    # until it is added in; under tensor parallelism torch's backward of the row-sharded table first makes
    # the whole vocabulary's gradient, before toolkit.train.parallel keeps this rank's rows. Other
    # micro-batches in flight (pipelines) still hold their activations.
    embedding_temp = (np.where(vocab_parallel, model.vocab, 0) + np.where(accumulating, vocab, 0)) * h \
        * unsharded_grad_b
    others = acts.total - acts.head * acts.heads_held - acts.freed_per_layer * acts.stage_layers \
        - acts.embedding / np.maximum(acts.in_flight, 1)
    phases["embedding backward"] = np.where(
        owns_embedding & (embedding_temp > 0) & (not lora),     # (Megatron's embedding makes sharded gradients)
        persistent + grads_full + embedding_temp + acts.embedding + others, 0.0)
    # When every forward ran first (GPipe), the second micro-batch's backward starts with all the gradients the
    # first one made and the activations of the others: its loss (last stage) or its top block's backward
    shared = acts.shared_per_layer * acts.stage_layers + np.where(owns_head, acts.shared_head, 0.0)
    one_micro_batch = (acts.total - shared) / np.maximum(acts.in_flight, 1)
    phases["next micro-batch"] = np.where(
        forwards_first & (micro_batches > 1),
        persistent + grads_full + acts.total - one_micro_batch + step_cache
        + np.where(owns_head, logits_grads, acts.recompute_layer + mlp_temp), 0.0)
    # torch's interleaved schedule, at its last backward: all it sent is still held (see activation_bytes), with
    # one block of one micro-batch being differentiated and autocast's weight casts
    phases["step end"] = np.where(
        acts.step_end_buffers > 0,
        persistent + grads_full + acts.step_end_buffers + acts.per_layer
        + acts.shared_per_layer * (acts.stage_layers - 1) + acts.recompute_layer + mlp_temp + step_cache, 0.0)
    # DeepSpeed ZeRO-1/2, the first gradient of a backward: an untied head's, whole, while the bucket it is copied
    # into is made (unless ZeRO-1 kept its bucket from an earlier micro-batch); every activation but the head's
    # is still held
    new_bucket = np.where(ds.stage1 & accumulating & ~forwards_first, 0.0, ds.bucket)
    phases["head gradient"] = np.where(
        (ds.bucket > 0) & owns_head & (counts.head > 0) & ~np.asarray(main_grads),
        persistent + grads_prev + after_head + head_grad + new_bucket + step_cache, 0.0)
    # DeepSpeed ZeRO-1/2, the backward's end: the last bucket flattened for its reduction; ZeRO-1 reduces its
    # whole gradients only now, so those not yet in the bucket are still there
    phases["gradient reduce"] = np.where(
        ds.bucket > 0,
        persistent + ds.bucket + ds.flat_copy
        + np.where(ds.stage1, np.maximum(ds.grads - ds.bucket, 0.0),
                   np.where(accumulating | (ds.grads > ds.bucket), ds.partition, 0.0)), 0.0)
    phases["optimizer step"] = _step_bytes(job, counts, persistent, step_grads, stage,
                                           np.where(ds.fixed > 0, 0.0, ds.partition), main_grads)
    names = list(phases)
    stacked = np.stack(np.broadcast_arrays(*(np.asarray(v, dtype=float) for v in phases.values())))
    index = stacked.argmax(axis=0)
    phase = np.asarray(names, dtype=object)[index]
    # (DeepSpeed's ZeRO-2 partitions reach past their ranges: see zero_buffers.deepspeed_reduce)
    grads_bytes = np.where((ds.grads > 0) & ~np.asarray(ds.stage1), ds.partition, states.grads_bytes)
    return MemoryEstimate(params_bytes=states.params_bytes, grads_bytes=grads_bytes,
                          optimizer_bytes=states.optimizer_bytes, activations_bytes=acts.total,
                          host_bytes=states.host_bytes, peak_bytes=stacked.max(axis=0),
                          peak_phase=phase, phases=phases, states=states)


def _step_bytes(job: Job, counts, persistent: float, grads_full: float, stage: str | None = None,
                partition: float = 0.0, main_grads=False) -> float:
    """Device bytes during the optimizer step (`partition`: DeepSpeed's 16-bit gradient partition, if not in
    `persistent`; `main_grads`: the fp32 main gradients are in `persistent` and are the masters' gradients)."""
    par = job.parallel
    largest = max(counts.embedding, counts.head, largest_matrix(job)) / np.asarray(par.tp)
    if job.finetune.adapters:                              # only the adapters are stepped
        largest = job.finetune.rank * max(job.model.hidden, job.model.ffn_, job.model.heads * job.model.head_dim_)
    step = persistent + grads_full + _optimizer_temp_bytes(job, largest, stage)
    if job.precision.mode.startswith("mixed-"):
        n = _trainable_per_device(job, stage)
        dp = np.asarray(1 if par.dp is None else par.dp)
        # DeepSpeed steps one flat fp32 partition: its fp32 gradient replaces the 16-bit one, and the optimizer's
        # temporaries are copies of the whole partition (for-loop: two, foreach: one, fused: none)
        flat = {"for-loop": 2, "foreach": 1, "fused": 0}[optimizer_impl(job)] if job.optimizer.name != "sgd" else 0
        deepspeed = persistent + 4 * n / dp + np.maximum(partition, flat * 4 * n / dp)
        step = np.where(np.asarray(par.zero) == 0,
                        np.where(main_grads, step, step + 4 * n - grads_full),   # fp32 copies replace 16-bit ones
                        deepspeed)
    return np.where(np.asarray(par.offload) != "none", persistent + grads_full, step)   # offload: step on the host


def _trainable_per_device(job: Job, stage: str | None = None):
    """Parameters the optimizer steps on one device (before ZeRO sharding): all, or LoRA's adapters."""
    par = job.parallel
    if job.finetune.adapters:
        return adapter_params_per_layer(job) * (job.model.layers // np.asarray(par.pp)) / np.asarray(par.tp)
    return params_per_device(job.model, par.tp, par.pp, stage, job_stage_layers(job))


def memory_notes(job: Job, mem: MemoryEstimate | None) -> list[str]:
    """What the memory figures assume, and what they leave out, in the words the CLI prints."""
    if mem is None:
        return ["activations need the model's shape (layers, hidden, heads): only model states are given"]
    notes = [f"memory follows the {job.memory.program} program of the runner's GPT "
             f"({job.memory.attention} attention, {optimizer_impl(job)} optimizer); peak at: {mem.peak_phase}"]
    par = job.parallel
    fsdp_traced = job.precision.mode in TORCH_SEMANTICS and par.zero in (2, 3) \
        and (par.offload == "none" or par.tp == 1)
    if par.tp > 1:
        notes.append("tensor parallelism follows torch's DTensor program (toolkit.train.parallel): with sp the "
                     "linears keep their all-gathered inputs, and the vocabulary-parallel loss and the embedding's "
                     "backward hold more than Megatron's fused kernels")
    combined_pp = par.pp > 1 and (par.tp > 1 or par.zero > 0)
    deepspeed = par.zero > 0 and job.precision.mode not in TORCH_SEMANTICS
    deepspeed_traced = deepspeed and par.tp == 1 and par.pp == 1 \
        and par.offload != "params"
    if combined_pp or (par.zero > 0 and not fsdp_traced and not deepspeed_traced) or (par.tp > 1 and par.zero == 1):
        notes.append("offload with tp, DeepSpeed's parameter offload (ZeRO-Infinity), tp with ZeRO-1 or with "
                     "DeepSpeed's ZeRO, and pp combined with tp or ZeRO follow Megatron's and the frameworks' "
                     "semantics and are not yet checked against a trace (replicas, torch's ZeRO-1/2/3 and FSDP2's "
                     "CPU offload, DeepSpeed's ZeRO-1/2/3 with or without ZeRO-Offload, tp alone or inside FSDP2, "
                     "and pipelines alone or interleaved are)")
    if par.offload != "none" and fsdp_traced:
        notes.append("FSDP2's CPU offload: sharded parameters, gradients and optimizer states in host memory, the "
                     "step on the host; a GPU also copies each shard to the device before all-gathering it and "
                     "each reduce-scattered gradient before sending it back (up to 1/dp of a block, briefly), "
                     "which the CPU program and this estimate leave out")
    if deepspeed:
        offload = ("; ZeRO-Offload keeps the fp32 partition, its gradient and the optimizer states on the host, "
                   + ("the 16-bit gradient partition there too" if par.zero == 3 else
                      "with a 16-bit copy of the partition, and a buffer the size of the largest tensor on each side")
                   if par.offload == "optimizer" else "")
        notes.append(f"DeepSpeed's ZeRO-{par.zero} as toolkit.trace.zero.deepspeed_config(job) sets it up: reduce "
                     f"bucket {job.training.bucket_cap_mb:g} MB (training.bucket_cap_mb; DeepSpeed's own default is "
                     f"1 GB in 16-bit)" + (", one block gathered and one prefetched" if par.zero == 3 else "")
                     + offload)
    if job.precision.grad_dtype == "fp32":
        notes.append("fp32 main gradients as Megatron keeps them: one fp32 buffer from start-up, each 16-bit "
                     "gradient added in and dropped" + (" (checked against a trace)" if par.zero == 0 and par.pp == 1
                                                        and par.tp == 1 else "; with ZeRO, tp or pp not yet checked "
                                                                             "against a trace"))
    if par.pp > 1 and par.schedule != "gpipe" and job.precision.mode in TORCH_SEMANTICS:
        m = job.grad_accum or 1
        stream = job.batch.micro_batch * job.model.seq_len * job.model.hidden / (par.tp if par.sp else 1) \
            * (4 if job.precision.mode.startswith("amp-") or job.precision.mode == "fp32" else 2)
        per_stage = m * stream * (2 * par.vpp - 1 if par.pp == 2 else 2 * par.vpp)
        kept = " and keeps every tensor it sent until the step ends (as much again)" if par.vpp > 1 else ""
        notes.append(f"pipeline stages follow torch.distributed.pipelining, which allocates a receive buffer for "
                     f"each of the step's {m} micro-batches, per chunk and direction{kept}: "
                     f"{per_stage * (2 if par.vpp > 1 else 1) / 2**30:.2f} GiB on the busiest stage here "
                     f"(Megatron reuses a few); fewer, larger micro-batches shrink it")
    if job.finetune.method == "qlora":
        notes.append("QLoRA as toolkit.train.qlora runs it: NF4 with double quantization (bitsandbytes' layout, "
                     "0.516 bytes a weight); its dequantizing matmul holds ~9 bytes per weight of one matrix at a "
                     "time, bitsandbytes' CUDA kernels about 2")
    if job.memory.act_compress == "int8":
        if job.memory.attention == "eager" or (job.model.dropout > 0 and job.memory.program == "cpu"):
            notes.append("int8 with explicit attention ops: activations within ~2 % of the trace, but the peak can "
                         "miss the score matrices backward unpacks (up to ~40 % low): measure it with `toolkit trace`")
        else:
            notes.append("int8 activations as the runner packs them (blocks only, 1 + 4/128 bytes a value)")
    return notes
