"""The moments of a training step where one pipeline stage's memory tops out: one function per moment, each a sum
of named terms that `stage_terms` computes once (numpy arrays over layouts, or plain numbers for one job).

The moments, in the order the step reaches them (the busiest one is the stage's peak):
- `forward end`: every activation held, the logits and their fp32 copy inside the loss;
- `loss`: the two fp32 logit-sized gradients of the cross-entropy (three under the vocabulary-parallel loss);
- `top layer forward`: int8 activations being packed, or QLoRA dequantizing the top block's down projection;
- `top layer` ... `bottom layer` of the backward pass: activations shrink and gradients grow linearly across
  layers, so the largest total sits at one of the ends (under FSDP2, which reduce-scatters each block's gradients
  while the next one runs and prefetches no block below the bottom one, also one layer in from either end);
- `embedding backward`: the token embedding's gradient, whole under tensor parallelism;
- `next micro-batch`, `step end`: pipeline schedules (GPipe's second backward, the interleaved schedule's end);
- `head gradient`, `gradient reduce`: DeepSpeed ZeRO-1/2's buckets;
- `optimizer step`: all gradients plus the optimizer's temporaries.
Each is checked against the traced program where it holds the peak (tests/estimate/test_phases.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..specs.backends import job_deepspeed_fp32
from ..specs.job import TORCH_SEMANTICS, Job
from .activations import ActivationBytes, activation_bytes, element_bytes
from .params import ParamCount, count_params
from .states import (StateBytes, adapter_params_per_layer, bf16_optimizer, bytes_per_param, job_stage_layers,
                     model_state_bytes, params_per_device, vocab_per_rank)
from .zero_buffers import (Gathered, Reduce, accumulated_grad_bytes, deepspeed_reduce, gathered_params,
                           largest_matrix, pipelined_fsdp)

__all__ = ["StageTerms", "stage_terms", "stage_phases", "optimizer_impl", "ddp_buckets", "BACKWARD_LAYERS"]


@dataclass(frozen=True)
class Position:
    """Where the stage sits in the pipeline and the step (arrays over layouts)."""
    single: object           # no pipelining
    owns_head: object        # holds the output projection and the loss
    owns_embedding: object   # holds the token embedding
    micro_batches: object    # per optimizer step
    accumulating: object     # more than one micro-batch per step (pipelining included)
    forwards_first: object   # every forward runs before any backward (GPipe; 1F1B whose warm-up covers the step)


@dataclass(frozen=True)
class Held:
    """What stays allocated through the step, and the gradients on top of it."""
    persistent: object       # weights, optimizer states and any buffer kept from start-up
    grads_full: object       # gradients at the end of backward that are not in `persistent`
    step_grads: object       # the gradients the optimizer step sees beside `persistent`
    grad_b: object           # bytes per gradient element
    main_grads: object       # Megatron's fp32 main-gradient buffer is in `persistent`
    no_growth: object        # gradients land in a buffer that already exists
    ds: Reduce               # DeepSpeed's reduce buffers (zeros elsewhere)


@dataclass(frozen=True)
class Gradients:
    """Gradients as backward makes them: head first, then layer by layer, embedding last."""
    per_layer_trainable: object
    layer_grad: object       # one block's, as the rank keeps it
    head_grad: object        # the head's (and the final norm's), unsharded until FSDP2's post-backward
    unsharded_grad_b: object  # bytes per element of a gradient before FSDP2 shards it
    grads_before: object     # made by earlier micro-batches of the step
    grads_prev: object       # of those, still held when this micro-batch runs


@dataclass(frozen=True)
class Temporaries:
    """Tensors that live for one moment of the step."""
    tokens: object
    ffn: object              # this rank's FFN width
    mlp_temp: object         # the MLP's backward beyond what it held
    vocab_parallel: object   # torch's vocabulary-parallel loss (tp > 1, torch semantics)
    logits_grads: object     # the loss's backward
    logits_bytes: object     # the logits and their fp32 copy, end of forward
    unpacked: object         # int8: the MLP's inner tensors unpacked to full size in backward
    autocast_cache: object   # autocast's cached 16-bit weight casts (full recompute)
    step_cache: object       # the same through backward, inside a pipeline schedule's one autocast context
    dequant_bytes: object    # QLoRA: one matrix being dequantized
    recompute_dequant: object  # the same, inside backward (full recompute rebuilds the block)


@dataclass(frozen=True)
class StageTerms:
    """Everything the moments of one stage's step are built from."""
    job: Job
    stage: object            # "first" | "second" | "last", or an array of those
    states: StateBytes
    acts: ActivationBytes
    counts: ParamCount
    gathered: Gathered       # FSDP2's and ZeRO-3's gathered parameters
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
    return torch_backend & (dp > 1) & (zero <= 1) & (np.asarray(par.tp) == 1) & (np.asarray(par.pp) == 1)


def _degrees(job: Job):
    """(tp, dp, zero) as arrays."""
    par = job.parallel
    return np.asarray(par.tp), np.asarray(1 if par.dp is None else par.dp), np.asarray(par.zero)


def trainable_per_device(job: Job, stage: str | None = None):
    """Parameters the optimizer steps on one device (before ZeRO sharding): all, or LoRA's adapters."""
    par = job.parallel
    if job.finetune.adapters:
        return adapter_params_per_layer(job) * (job.model.layers // np.asarray(par.pp)) / np.asarray(par.tp)
    return params_per_device(job.model, par.tp, par.pp, stage, job_stage_layers(job))


def _position(job: Job, stage, acts: ActivationBytes) -> Position:
    single = np.asarray(job.parallel.pp) == 1
    micro_batches = np.asarray(1 if job.grad_accum is None else job.grad_accum)
    # GPipe runs every forward before any backward, and so does 1F1B on a stage whose warm-up covers all the
    # step's micro-batches: no gradient exists while the activations pile up
    return Position(single=single, owns_head=single | (stage == "last"), owns_embedding=single | (stage == "first"),
                    micro_batches=micro_batches, accumulating=micro_batches > 1,
                    forwards_first=~single & (acts.in_flight >= micro_batches))


def _stage_gathered(job: Job, gathered: Gathered, counts: ParamCount, where: Position, acts: ActivationBytes):
    """FSDP2 under a pipeline schedule gathers this rank's own blocks and its chunks' roots: the embedding on the
    first, the final norm and the head on the last (a tied head its own copy of the embedding)."""
    piped = pipelined_fsdp(job)
    if not np.any(piped):
        return gathered
    elem = job.precision.plan.compute_bytes / np.asarray(job.parallel.tp)
    root = (np.where(where.owns_embedding, counts.embedding + counts.positions, 0)
            + np.where(where.owns_head, (counts.head or counts.embedding) + counts.final, 0)) * elem
    return dataclasses.replace(gathered, root=np.where(piped, root, gathered.root),
                               blocks=np.where(piped, counts.per_layer * elem * acts.stage_layers, gathered.blocks))


def _held(job: Job, stage, states: StateBytes, counts: ParamCount, where: Position) -> Held:
    """What persists, by framework: DeepSpeed's buffers, Megatron's fp32 main gradients, DeepSpeed's BF16
    optimizer and DDP's buckets each move some gradients into buffers that exist from start-up."""
    tp, dp, zero = _degrees(job)
    _w, grad_b, _o = bytes_per_param(job)
    persistent = states.params_bytes + states.optimizer_bytes
    grads_full = states.grads_bytes
    ds = deepspeed_reduce(job, trainable_per_device(job, stage), grad_b, dp,
                          ends=(np.where(where.owns_embedding, counts.embedding, 0) / tp,
                                np.where(where.owns_head, counts.head, 0) / tp))
    persistent = persistent + ds.fixed + ds.staging
    grads_full = np.where(ds.fixed > 0, 0.0, grads_full)          # (DeepSpeed's ZeRO-3: counted in persistent)
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
    step_grads = np.where(bucketed, 0.0, grads_full)            # by the step every gradient is a bucket's view
    grads_full = np.where(bucket_is_grads, 0.0, grads_full)
    # FSDP2 under a pipeline schedule keeps the stage's gradients whole until the step's last backward; the step
    # then sees their shards
    grads_full = np.where(pipelined_fsdp(job), trainable_per_device(job, stage) * accumulated_grad_bytes(job),
                          grads_full)
    return Held(persistent=persistent, grads_full=grads_full, step_grads=step_grads, grad_b=grad_b,
                main_grads=main_grads, no_growth=main_grads | bucket_is_grads, ds=ds)


def _gradients(job: Job, stage, acts: ActivationBytes, counts: ParamCount, gathered: Gathered, where: Position,
               held: Held) -> Gradients:
    tp, dp, zero = _degrees(job)
    par, lora, ds = job.parallel, job.finetune.adapters, held.ds
    per_layer_trainable = adapter_params_per_layer(job) if lora else counts.per_layer
    piped = pipelined_fsdp(job)
    layer_grad = np.where(held.no_growth, 0.0,
                          per_layer_trainable / tp * np.where(piped, accumulated_grad_bytes(job),
                                                              held.grad_b / np.where(zero >= 2, dp, 1)))
    head_param = np.where(where.owns_head, 0 if lora else (counts.head if counts.head else counts.embedding),
                          0)  # tied: at the head
    # FSDP2 computes gradients on the gathered (16-bit) weights and shards them at each module's post-backward:
    # the root's (head) until the end of backward, a block's until the block is done
    unsharded_grad_b = np.where((gathered.reduce_scatter > 0) | held.main_grads | piped,
                                job.precision.plan.compute_bytes, held.grad_b)
    head_grad = np.where(held.no_growth, 0.0,
                         (head_param + np.where(where.owns_head & (not lora), counts.final, 0)) * unsharded_grad_b / tp)
    # gradients made by earlier micro-batches of the step; interleaved over one round (m <= p) the last stage
    # runs every backward of its head chunk before any of its other chunks'
    one_round = (np.asarray(par.vpp) > 1) & (where.micro_batches // np.asarray(par.pp) <= 1) & (stage == "last")
    grads_before = np.where(one_round, head_grad + layer_grad * acts.stage_layers / np.asarray(par.vpp),
                            held.grads_full)
    # DeepSpeed's ZeRO-1 reduces at the step's end (and its bucket, once made, stays until then); ZeRO-2 into its
    # partition at every micro-batch
    grads_before = np.select([ds.stage1, ds.grads > 0], [ds.grads, ds.partition], grads_before)
    grads_prev = np.where(where.accumulating & ~where.forwards_first,
                          grads_before + np.where(ds.stage1, ds.bucket, 0.0), 0.0)
    return Gradients(per_layer_trainable=per_layer_trainable, layer_grad=layer_grad, head_grad=head_grad,
                     unsharded_grad_b=unsharded_grad_b, grads_before=grads_before, grads_prev=grads_prev)


def _temporaries(job: Job, acts: ActivationBytes, gathered: Gathered, where: Position) -> Temporaries:
    model, par, plan = job.model, job.parallel, job.precision.plan
    tp = np.asarray(par.tp)
    h, vocab = model.hidden, vocab_per_rank(model, tp)
    tokens = np.asarray(job.batch.micro_batch) * model.seq_len / par.cp    # this rank's share under context parallelism
    tokens_h = np.where(par.sp, tokens / tp, tokens)
    act, residual = plan.compute_bytes, element_bytes(job)[1]  # (FSDP2 under amp-* casts each block's input to 16-bit)
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
    vocab_parallel = (tp > 1) & (job.precision.mode in TORCH_SEMANTICS)      # mixed-*: Megatron's fused kernel
    # int8 saved activations: backward unpacks the MLP's inner tensors to full size next to their gradients
    # (explicit attention's unpacked score matrices: not modelled yet)
    unpacked = (2 if model.mlp == "swiglu" else 1) * tokens * ffn * act if job.memory.act_compress == "int8" else 0.0
    # End of forward, inside the loss: the logits (16-bit under autocast or 16-bit weights) and their fp32
    # copy are alive beside the log-softmax; under autocast its cache still holds the blocks' 16-bit weight
    # casts, which full (and per-op) recompute does not otherwise keep.
    q, kv = model.heads * model.head_dim_, model.kv_heads_ * model.head_dim_
    layer_matmuls = 2 * h * q + 2 * h * kv + (3 if model.mlp == "swiglu" else 2) * h * model.ffn_
    if job.finetune.adapters:                 # autocast caches casts of trainable leaves only: the adapters
        layer_matmuls = adapter_params_per_layer(job)
    caching = ((plan.family == "amp") & np.isin(job.memory.recompute, ("full", "selective-op"))
               & (gathered.root == 0) & (gathered.in_backward == 0))
    autocast_cache = np.where(caching, 2 * acts.stage_layers * layer_matmuls / tp, 0.0)   # head's cast is saved
    # QLoRA: the top block's down projection, forward: its weight being dequantized, with the unpacked indices
    # (1 byte), their int32 copy for the table lookup and the looked-up levels (toolkit.train.qlora); under full
    # recompute the same happens inside backward, while the block is rebuilt
    dequant = (1 + 4 + 2 + 2) * h * model.ffn_ if job.finetune.method == "qlora" else 0.0
    return Temporaries(
        tokens=tokens, ffn=ffn, mlp_temp=mlp_temp, vocab_parallel=vocab_parallel,
        logits_grads=np.where(vocab_parallel, 3, 2) * tokens * vocab * 4,
        logits_bytes=tokens * vocab * ((4 if plan.family == "fp32" else 2 + 4) + np.where(vocab_parallel, 4, 0)),
        unpacked=unpacked, autocast_cache=autocast_cache,
        step_cache=np.where(where.single, 0.0, autocast_cache),   # a pipeline schedule runs in one autocast context
        dequant_bytes=dequant,
        recompute_dequant=np.where(np.asarray(job.memory.recompute) == "full", dequant, 0.0) if dequant else 0.0)


def stage_terms(job: Job, stage, stages_after=None) -> StageTerms:
    """The terms of one pipeline stage ("first", "second" or "last", or an array of those; without pipelining each
    is the whole model)."""
    states = model_state_bytes(job, stage)
    acts = activation_bytes(job, stage, stages_after)
    counts = count_params(job.model)
    where = _position(job, stage, acts)
    gathered = _stage_gathered(job, gathered_params(job, counts), counts, where, acts)
    held = _held(job, stage, states, counts, where)
    return StageTerms(job=job, stage=stage, states=states, acts=acts, counts=counts, gathered=gathered,
                      position=where, held=held, grads=_gradients(job, stage, acts, counts, gathered, where, held),
                      temps=_temporaries(job, acts, gathered, where))


# ---- the moments ------------------------------------------------------------------------------------------------

def _before_loss(t: StageTerms):
    """Held at the end of forward and through the loss: every activation and gathered parameter."""
    g = t.gathered
    return t.held.persistent + t.grads.grads_prev + t.acts.total + g.blocks + g.root + g.at_loss


def forward_end(t: StageTerms):
    return (_before_loss(t) + np.where(t.position.owns_head, t.temps.logits_bytes, 0.0) + t.temps.autocast_cache
            + t.gathered.forward_tail)


def loss(t: StageTerms):
    return _before_loss(t) + np.where(t.position.owns_head, t.temps.logits_grads, 0.0) + t.temps.step_cache


def top_layer_forward(t: StageTerms):
    """int8: the top block's full-size MLP tensors beside the compressed ones until each is packed; QLoRA: the top
    block's down projection being dequantized. None where neither applies."""
    job, acts = t.job, t.acts
    base = t.held.persistent + t.grads.grads_prev + acts.layers + acts.embedding
    if job.finetune.method == "qlora":
        return base + t.temps.dequant_bytes
    if job.memory.act_compress == "int8":
        inner = (3 if job.model.mlp == "swiglu" else 2) * t.temps.tokens * t.temps.ffn * job.precision.plan.compute_bytes
        return base + t.gathered.blocks + t.gathered.root + inner
    return None


BACKWARD_LAYERS = (("top layer", lambda n: 0), ("layer below the top", lambda n: np.minimum(n - 1, 1)),
                   ("layer above the bottom", lambda n: np.maximum(n - 2, 0)), ("bottom layer", lambda n: n - 1))
"""The backward moments inside the blocks, with how many of the stage's n blocks are done by then."""


def _layer_parts(t: StageTerms, done_layers, bottom: bool):
    """(held apart from activations, activations held, the down projection's new gradient) while a block's MLP runs
    its backward, `done_layers` blocks into the stage's backward."""
    job, g, gr, held, ds = t.job, t.gathered, t.grads, t.held, t.held.ds
    h, ffn, where = job.model.hidden, t.temps.ffn, t.position
    # by the MLP's backward, the layer has made its down-projection's weight gradient too; when
    # accumulating, that gradient is a temporary (in the compute dtype, then cast) added into .grad
    if job.finetune.adapters:                                     # only an adapter on down has a gradient
        down_grad = job.finetune.rank * (ffn + h) * held.grad_b * ("down" in job.finetune.targets)
    else:
        down_grad = h * ffn * gr.unsharded_grad_b
    made = gr.head_grad + done_layers * gr.layer_grad
    # DeepSpeed's ZeRO-2 copies each gradient into its bucket, and the bucket, when full, into the partition
    whole = gr.head_grad + done_layers * gr.per_layer_trainable * held.grad_b / np.asarray(job.parallel.tp)
    made = np.where(ds.bucket > 0, np.where(ds.stage1, whole, ds.flushed(whole) * ds.partition), made) + ds.bucket
    made = np.where(ds.fixed > 0, 0.0, made)                      # ZeRO-3: straight into its bucket
    # accumulating: earlier micro-batches' gradients, plus the new ones not yet added in (replicas: the down
    # projection's, and under autocast its 16-bit original beside the fp32 cast; FSDP2: also the root's whole
    # 16-bit head gradient, reduce-scattered only at the end of backward)
    adding = np.where(g.reduce_scatter > 0, gr.head_grad, h * ffn * 2 if job.precision.plan.family == "amp" else 0)
    grads = np.where(where.accumulating & ~where.forwards_first, gr.grads_before + ds.bucket + down_grad + adding,
                     made + down_grad)
    if bottom:                          # a full bucket being reduced meanwhile: flattened again (errs high by that)
        grads = grads + np.where(ds.grads > ds.bucket, ds.flat_copy, 0.0)
    acts = t.acts
    held_acts = acts.total - acts.head - done_layers * acts.freed_per_layer   # one micro-batch goes backward at a time
    # FSDP2 reshards each block after its backward, except in a pipeline's stages (until the step's last backward)
    still_gathered = np.where(pipelined_fsdp(job), g.blocks, g.blocks * (1 - done_layers / np.maximum(acts.stage_layers, 1)))
    in_backward = g.in_backward - (g.prefetch if bottom else 0.0)
    return held.persistent + grads + still_gathered + g.root + in_backward, held_acts, down_grad


def backward_layer(t: StageTerms, done_layers, bottom: bool = False):
    """A block's MLP backward, `done_layers` blocks into the stage's backward."""
    base, held_acts, _down = _layer_parts(t, done_layers, bottom)
    # below the top block, the block above is still reduce-scattering its gradients (FSDP2 overlaps them)
    overlap = np.where(np.asarray(done_layers) > 0, t.gathered.reduce_scatter, 0.0)
    # (QLoRA rebuilding a block: its dequantizing moment counted on top, which errs 4-6 % high)
    tmp = t.temps
    return (base + held_acts + t.acts.recompute_layer + tmp.mlp_temp + overlap + tmp.unpacked + tmp.step_cache
            + tmp.recompute_dequant)


def top_layer_reduce_scatter(t: StageTerms):
    """The top block's post-backward: its activations are gone, it is resharded, and its unsharded gradients are
    copied into the reduce-scatter input (FSDP2 only; 0 elsewhere)."""
    g = t.gathered
    base, held_acts, down_grad = _layer_parts(t, 0, False)
    block_grads = t.counts.per_layer / np.asarray(t.job.parallel.tp) * t.grads.unsharded_grad_b
    resharded = np.where(g.blocks > 0, g.block, 0.0)
    return np.where(g.reduce_scatter > 0,
                    base - down_grad - resharded + held_acts - t.acts.freed_per_layer + block_grads + g.reduce_scatter,
                    0.0)


def backward_phases(t: StageTerms) -> dict:
    """The moments inside the blocks' backward, top to bottom (one layer in from either end only under FSDP2)."""
    phases = {}
    for name, done in BACKWARD_LAYERS:
        if (name == "layer below the top" and not np.any(t.gathered.reduce_scatter)) or \
                (name == "layer above the bottom" and not np.any(t.gathered.prefetch)):
            continue
        phases[name] = backward_layer(t, done(t.acts.stage_layers), bottom=name == "bottom layer")
        if name == "top layer":
            phases["top layer reduce-scatter"] = top_layer_reduce_scatter(t)
    return phases


def embedding_backward(t: StageTerms):
    """The token embedding's backward, last: when accumulating, its new gradient is a temporary beside .grad until it
    is added in; under tensor parallelism torch's backward of the row-sharded table first makes the whole
    vocabulary's gradient, before toolkit.train.parallel keeps this rank's rows. Other micro-batches in flight
    (pipelines) still hold their activations."""
    model, acts, where = t.job.model, t.acts, t.position
    vocab = vocab_per_rank(model, np.asarray(t.job.parallel.tp))
    embedding_temp = (np.where(t.temps.vocab_parallel, model.vocab, 0) + np.where(where.accumulating, vocab, 0)) \
        * model.hidden * t.grads.unsharded_grad_b
    others = acts.total - acts.head * acts.heads_held - acts.freed_per_layer * acts.stage_layers \
        - acts.embedding / np.maximum(acts.in_flight, 1)
    kept = np.where(pipelined_fsdp(t.job), t.gathered.blocks + t.gathered.root, 0.0)   # (pipelines: gathered)
    return np.where(
        where.owns_embedding & (embedding_temp > 0) & (not t.job.finetune.adapters),  # (Megatron's: sharded grads)
        t.held.persistent + t.held.grads_full + embedding_temp + acts.embedding + others + kept, 0.0)


def next_micro_batch(t: StageTerms):
    """When every forward ran first (GPipe), the second micro-batch's backward starts with all the gradients the
    first one made and the activations of the others: its loss (last stage) or its top block's backward."""
    acts, where, tmp = t.acts, t.position, t.temps
    shared = acts.shared_per_layer * acts.stage_layers + np.where(where.owns_head, acts.shared_head, 0.0)
    one_micro_batch = (acts.total - shared) / np.maximum(acts.in_flight, 1)
    return np.where(
        where.forwards_first & (where.micro_batches > 1),
        t.held.persistent + t.held.grads_full + acts.total - one_micro_batch + tmp.step_cache
        + t.gathered.blocks + t.gathered.root                   # (FSDP2 stages keep them gathered)
        + np.where(where.owns_head, tmp.logits_grads, acts.recompute_layer + tmp.mlp_temp), 0.0)


def step_end(t: StageTerms):
    """torch's interleaved schedule, at its last backward: all it sent is still held (see activation_bytes), with one
    block of one micro-batch being differentiated and autocast's weight casts."""
    acts, tmp = t.acts, t.temps
    return np.where(
        acts.step_end_buffers > 0,
        t.held.persistent + t.held.grads_full + acts.step_end_buffers + acts.per_layer + t.gathered.blocks
        + t.gathered.root + acts.shared_per_layer * (acts.stage_layers - 1) + acts.recompute_layer + tmp.mlp_temp
        + tmp.step_cache, 0.0)


def head_gradient(t: StageTerms):
    """DeepSpeed ZeRO-1/2, the first gradient of a backward: an untied head's, whole, while the bucket it is copied
    into is made (unless ZeRO-1 kept its bucket from an earlier micro-batch); every activation but the head's is
    still held."""
    ds, where = t.held.ds, t.position
    new_bucket = np.where(ds.stage1 & where.accumulating & ~where.forwards_first, 0.0, ds.bucket)
    return np.where(
        (ds.bucket > 0) & where.owns_head & (t.counts.head > 0) & ~np.asarray(t.held.main_grads),
        t.held.persistent + t.grads.grads_prev + (t.acts.total - t.acts.head) + t.grads.head_grad + new_bucket
        + t.temps.step_cache, 0.0)


def gradient_reduce(t: StageTerms):
    """DeepSpeed ZeRO-1/2, the backward's end: the last bucket flattened for its reduction; ZeRO-1 reduces its whole
    gradients only now, so those not yet in the bucket are still there."""
    ds = t.held.ds
    return np.where(
        ds.bucket > 0,
        t.held.persistent + ds.bucket + ds.flat_copy
        + np.where(ds.stage1, np.maximum(ds.grads - ds.bucket, 0.0),
                   np.where(t.position.accumulating | (ds.grads > ds.bucket), ds.partition, 0.0)), 0.0)


def stage_reduce_scatter(t: StageTerms):
    """FSDP2 under a pipeline schedule, after the step's last backward: every whole gradient is still there while
    the first unit copies its own into the reduce-scatter input (the reduce dtype) and receives its shard."""
    g, counts, tp = t.gathered, t.counts, np.asarray(t.job.parallel.tp)
    root = np.where(t.position.owns_head, counts.head + counts.final, 0) + np.where(
        t.position.owns_embedding, counts.embedding + counts.positions, 0)
    unit = np.maximum(counts.per_layer, root) / tp * accumulated_grad_bytes(t.job)
    return np.where(pipelined_fsdp(t.job),
                    t.held.persistent + t.held.grads_full + g.blocks + g.root + unit + t.held.step_grads, 0.0)


def _optimizer_temp_bytes(job: Job, largest_param: float, stage: str | None = None) -> float:
    """Temporaries of one optimizer step, in bytes."""
    name, impl = job.optimizer.name, optimizer_impl(job)
    if name in ("sgd", "adamw-8bit") or impl == "fused":     # (bitsandbytes updates its 8-bit states in place)
        return 0.0
    _tp, dp, zero = _degrees(job)
    state = job.precision.plan.state_bytes
    shard = np.where(zero >= 1, dp, 1)                       # the optimizer steps this rank's shard only
    n = trainable_per_device(job, stage) / shard
    if impl == "foreach":
        return n * state                                     # sqrt(v) for every tensor at once
    # ZeroRedundancyOptimizer (torch ZeRO-1) gives whole tensors to ranks; FSDP2 and DeepSpeed split them
    split = np.where((zero >= 2) | ((zero == 1) & job.precision.plan.master_weights), dp, 1)
    return 2 * largest_param / split * state                 # sqrt(v) and its scaled copy, one tensor at a time


def optimizer_step(t: StageTerms):
    """All gradients plus the optimizer's temporaries (for-loop: two copies of the largest tensor; foreach: one copy
    of every state tensor; fused: none) and, for mixed-*, the fp32 copies of the gradients the masters are stepped
    with; with offload the step runs on the host."""
    job, par, held = t.job, t.job.parallel, t.held
    persistent, grads_full = held.persistent, held.step_grads
    largest = max(t.counts.embedding, t.counts.head, largest_matrix(job)) / np.asarray(par.tp)
    if job.finetune.adapters:                              # only the adapters are stepped
        largest = job.finetune.rank * max(job.model.hidden, job.model.ffn_, job.model.heads * job.model.head_dim_)
    step = persistent + grads_full + _optimizer_temp_bytes(job, largest, t.stage)
    ds32, masters = job_deepspeed_fp32(job), job.precision.plan.master_weights
    if masters or np.any(ds32):
        n = trainable_per_device(job, t.stage)
        dp = np.asarray(1 if par.dp is None else par.dp)
        # DeepSpeed steps one flat fp32 partition: its fp32 gradient replaces the 16-bit one, and the optimizer's
        # temporaries are copies of the whole partition (for-loop: two, foreach: one, fused: none)
        flat = {"for-loop": 2, "foreach": 1, "fused": 0}[optimizer_impl(job)] if job.optimizer.name != "sgd" else 0
        partition = np.where(held.ds.fixed > 0, 0.0, held.ds.partition)     # (ZeRO-3's: in persistent)
        deepspeed = persistent + 4 * n / dp + np.maximum(partition, flat * 4 * n / dp)
        replicas = np.where(held.main_grads, step, step + 4 * n - grads_full) if masters else step  # (fp32 copies
        step = np.where(np.asarray(par.zero) == 0, replicas, np.where(masters | ds32, deepspeed, step))  # of 16-bit)
    return np.where(np.asarray(par.offload) != "none", persistent + grads_full, step)   # offload: step on the host


def stage_phases(t: StageTerms) -> dict:
    """Every moment's total, in the order the step reaches them (ties go to the earlier one)."""
    phases = {"forward end": forward_end(t), "loss": loss(t)}
    top_forward = top_layer_forward(t)
    if top_forward is not None:
        phases["top layer forward"] = top_forward
    phases.update(backward_phases(t))
    phases["embedding backward"] = embedding_backward(t)
    phases["next micro-batch"] = next_micro_batch(t)
    phases["step end"] = step_end(t)
    phases["head gradient"] = head_gradient(t)
    phases["gradient reduce"] = gradient_reduce(t)
    phases["stage reduce-scatter"] = stage_reduce_scatter(t)
    phases["optimizer step"] = optimizer_step(t)
    return phases
