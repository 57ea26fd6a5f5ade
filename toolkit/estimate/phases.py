"""The moments of a training step where one pipeline stage's memory tops out: one function per moment, each a sum
of named terms that `stage_terms` (toolkit.estimate.stage_terms) computes once (numpy arrays over layouts, or
plain numbers for one job).

The moments, in the order the step reaches them (the busiest one is the stage's peak):
- `forward end`: every activation held, the logits and their fp32 copy inside the loss;
- `loss`: the two fp32 logit-sized gradients of the cross-entropy (three under the vocabulary-parallel loss);
- `top layer forward`: int8 activations being packed, or QLoRA dequantizing the top block's down projection;
- `top layer` ... `bottom layer` of the backward pass: activations shrink and gradients grow linearly across
  layers, so the largest total sits at one of the ends (under FSDP2, which reduce-scatters each block's gradients
  while the next one runs and prefetches no block below the bottom one, also one layer in from either end);
- `embedding backward`: the token embedding's gradient, whole under tensor parallelism;
- `next micro-batch`, `step end`: pipeline schedules (GPipe's second backward, the interleaved schedule's end);
- `head gradient`, `gradient reduce`: DeepSpeed ZeRO-1/2's buckets, and its BF16 optimizer's all-reduce;
- `optimizer step`: all gradients plus the optimizer's temporaries.
Each is checked against the traced program where it holds the peak (tests/estimate/test_phases.py).
"""

from __future__ import annotations

import numpy as np

from ..specs.backends import bf16_optimizer, job_deepspeed_fp32
from ..specs.job import Job
from .comm import is_megatron
from .moe import down_params
from .stage_terms import StageTerms, ddp_buckets, degrees, optimizer_impl, stage_terms, trainable_per_device
from .states import vocab_per_rank
from .zero_buffers import accumulated_grad_bytes, largest_matrix, pipelined_fsdp

__all__ = ["StageTerms", "stage_terms", "stage_phases", "optimizer_impl", "ddp_buckets", "BACKWARD_LAYERS"]


def _before_loss(t: StageTerms):
    """Held at the end of forward and through the loss: every activation and gathered parameter."""
    g = t.gathered
    return t.held.persistent + t.grads.grads_prev + t.acts.total + g.blocks + g.root + g.at_loss


def forward_end(t: StageTerms):
    return (
        _before_loss(t)
        + np.where(t.position.owns_head, t.temps.logits_bytes, 0.0)
        + t.temps.autocast_cache
        + t.gathered.forward_tail
    )


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
        inner = (
            (3 if job.model.mlp == "swiglu" else 2) * t.temps.tokens * t.temps.ffn * job.precision.plan.compute_bytes
        )
        return base + t.gathered.blocks + t.gathered.root + inner
    return None


BACKWARD_LAYERS = (
    ("top layer", lambda n: 0),
    ("layer below the top", lambda n: np.minimum(n - 1, 1)),
    ("layer above the bottom", lambda n: np.maximum(n - 2, 0)),
    ("bottom layer", lambda n: n - 1),
)
"""The backward moments inside the blocks, with how many of the stage's n blocks are done by then."""


def _layer_parts(t: StageTerms, done_layers, bottom: bool):
    """(held apart from activations, activations held, the down projection's new gradient) while a block's MLP runs
    its backward, `done_layers` blocks into the stage's backward."""
    job, g, gr, held, ds = t.job, t.gathered, t.grads, t.held, t.held.ds
    h, ffn, where = job.model.hidden, t.temps.ffn, t.position
    # by the MLP's backward, the layer has made its down-projection's weight gradient too; when
    # accumulating, that gradient is a temporary (in the compute dtype, then cast) added into .grad
    if job.finetune.adapters:  # only an adapter on down has a gradient
        down_grad = job.finetune.rank * (ffn + h) * held.grad_b * ("down" in job.finetune.targets)
    else:
        down_grad = down_params(job) * gr.unsharded_grad_b
    made = gr.head_grad + done_layers * gr.layer_grad
    # DeepSpeed's ZeRO-2 copies each gradient into its bucket, and the bucket, when full, into the partition
    whole = gr.head_grad + done_layers * gr.per_layer_trainable * held.grad_b / np.asarray(job.parallel.tp)
    made = np.where(ds.bucket > 0, np.where(ds.stage1, whole, ds.flushed(whole) * ds.partition), made) + ds.bucket
    made = np.where(ds.fixed > 0, 0.0, made)  # ZeRO-3: straight into its bucket
    # accumulating: earlier micro-batches' gradients, plus the new ones not yet added in (replicas: the down
    # projection's, and under autocast its 16-bit original beside the fp32 cast; FSDP2: also the root's whole
    # 16-bit head gradient, reduce-scattered only at the end of backward)
    adding = np.where(
        g.reduce_scatter > 0, gr.head_grad, down_params(job) * 2 if job.precision.plan.family == "amp" else 0
    )
    grads = np.where(
        where.accumulating & ~where.forwards_first, gr.grads_before + ds.bucket + down_grad + adding, made + down_grad
    )
    if bottom:  # a full bucket being reduced meanwhile: flattened again (errs high by that)
        grads = grads + np.where(ds.grads > ds.bucket, ds.flat_copy, 0.0)
    acts = t.acts
    held_acts = acts.total - acts.head - done_layers * acts.freed_per_layer  # one micro-batch goes backward at a time
    # FSDP2 reshards each block after its backward, except in a pipeline's stages (until the step's last backward)
    still_gathered = np.where(
        pipelined_fsdp(job), g.blocks, g.blocks * (1 - done_layers / np.maximum(acts.stage_layers, 1))
    )
    in_backward = g.in_backward - (g.prefetch if bottom else 0.0)
    return held.persistent + grads + still_gathered + g.root + in_backward, held_acts, down_grad


def backward_layer(t: StageTerms, done_layers, bottom: bool = False):
    """A block's MLP backward, `done_layers` blocks into the stage's backward."""
    base, held_acts, _down = _layer_parts(t, done_layers, bottom)
    # below the top block, the block above is still reduce-scattering its gradients (FSDP2 overlaps them)
    overlap = np.where(np.asarray(done_layers) > 0, t.gathered.reduce_scatter, 0.0)
    # (QLoRA rebuilding a block: its dequantizing moment counted on top, which errs 4-6 % high)
    tmp = t.temps
    return (
        base
        + held_acts
        + t.acts.recompute_layer
        + tmp.mlp_temp
        + overlap
        + tmp.unpacked
        + tmp.step_cache
        + tmp.recompute_dequant
        - tmp.experts_freed
    )


def gloo_copy(job: Job, input_bytes):
    """What gloo holds beside a reduce-scatter's input until the call returns. Gloo has no reduce-scatter: torch's
    ProcessGroupGloo clones the input, all-reduces the clone and copies this rank's chunk out of it
    (reduce_scatter_tensor_coalesced), so the CPU program (gloo ranks) holds the input twice; NCCL, and so the
    cuda program, reduces in place. Over one rank FSDP2 calls no collective: it copies the input to the output."""
    return np.where((job.memory.program == "cpu") & (np.asarray(job.parallel.dp) > 1), input_bytes, 0.0)


def top_layer_reduce_scatter(t: StageTerms):
    """The top block's post-backward (FSDP2 only; 0 elsewhere): its activations are gone and it is resharded. First
    its unsharded gradients are copied into the reduce-scatter input; then they are freed, and the collective runs
    with its output (1/dp of the input) made and, on gloo, the input's clone (`gloo_copy`). The larger of the two."""
    g = t.gathered
    base, held_acts, down_grad = _layer_parts(t, 0, False)
    block_grads = t.counts.per_layer / np.asarray(t.job.parallel.tp) * t.grads.unsharded_grad_b
    resharded = np.where((g.blocks > 0) | (g.in_backward > 0), g.block, 0.0)  # (ZeRO-2's, or ZeRO-3's regathered)
    around = base - down_grad - resharded + held_acts - t.acts.freed_per_layer + g.reduce_scatter
    copy_in = around + block_grads
    collective = around + g.reduce_scatter / degrees(t.job)[1] + gloo_copy(t.job, g.reduce_scatter)
    return np.where(g.reduce_scatter > 0, np.maximum(copy_in, collective), 0.0)


def backward_phases(t: StageTerms) -> dict:
    """The moments inside the blocks' backward, top to bottom (one layer in from either end only under FSDP2)."""
    phases = {}
    for name, done in BACKWARD_LAYERS:
        if (name == "layer below the top" and not np.any(t.gathered.reduce_scatter)) or (
            name == "layer above the bottom" and not np.any(t.gathered.prefetch)
        ):
            continue
        phases[name] = backward_layer(t, done(t.acts.stage_layers), bottom=name == "bottom layer")
        if name == "top layer":
            phases["top layer reduce-scatter"] = top_layer_reduce_scatter(t)
    return phases


def embedding_backward(t: StageTerms):
    """The token embedding's backward, last: when accumulating, its new gradient is a temporary beside .grad until it
    is added in; under tensor parallelism torch's backward of the row-sharded table first makes the whole
    vocabulary's gradient, before toolkit.program.parallel keeps this rank's rows. Other micro-batches in flight
    (pipelines) still hold their activations."""
    model, acts, where = t.job.model, t.acts, t.position
    vocab = vocab_per_rank(model, np.asarray(t.job.parallel.tp))
    embedding_temp = (
        (np.where(t.temps.vocab_parallel, model.vocab, 0) + np.where(where.accumulating, vocab, 0))
        * model.hidden
        * t.grads.unsharded_grad_b
    )
    others = (
        acts.total
        - acts.head * acts.heads_held
        - acts.freed_per_layer * acts.stage_layers
        - acts.embedding / np.maximum(acts.in_flight, 1)
    )
    kept = np.where(pipelined_fsdp(t.job), t.gathered.blocks + t.gathered.root, 0.0)  # (pipelines: gathered)
    return np.where(
        where.owns_embedding & (embedding_temp > 0) & (not t.job.finetune.adapters),  # (Megatron's: sharded grads)
        t.held.persistent + t.held.grads_full + embedding_temp + acts.embedding + others + kept,
        0.0,
    )


def next_micro_batch(t: StageTerms):
    """When every forward ran first (GPipe), the second micro-batch's backward starts with all the gradients the
    first one made and the activations of the others: its loss (last stage) or its top block's backward."""
    acts, where, tmp = t.acts, t.position, t.temps
    shared = acts.shared_per_layer * acts.stage_layers + np.where(where.owns_head, acts.shared_head, 0.0)
    one_micro_batch = (acts.total - shared) / np.maximum(acts.in_flight, 1)
    return np.where(
        where.forwards_first & (where.micro_batches > 1),
        t.held.persistent
        + t.held.grads_full
        + acts.total
        - one_micro_batch
        + tmp.step_cache
        + t.gathered.blocks
        + t.gathered.root  # (FSDP2 stages keep them gathered)
        + np.where(where.owns_head, tmp.logits_grads, acts.recompute_layer + tmp.mlp_temp),
        0.0,
    )


def step_end(t: StageTerms):
    """torch's interleaved schedule, at its last backward: all it sent is still held (see activation_bytes), with one
    block of one micro-batch being differentiated and autocast's weight casts."""
    acts, tmp = t.acts, t.temps
    return np.where(
        acts.step_end_buffers > 0,
        t.held.persistent
        + t.held.grads_full
        + acts.step_end_buffers
        + acts.per_layer
        + t.gathered.blocks
        + t.gathered.root
        + acts.shared_per_layer * (acts.stage_layers - 1)
        + acts.recompute_layer
        + tmp.mlp_temp
        + tmp.step_cache,
        0.0,
    )


def head_gradient(t: StageTerms):
    """DeepSpeed ZeRO-1/2, the first gradient of a backward: an untied head's, whole, while the bucket it is copied
    into is made (unless ZeRO-1 kept its bucket from an earlier micro-batch); every activation but the head's is
    still held."""
    ds, where = t.held.ds, t.position
    new_bucket = np.where(ds.stage1 & where.accumulating & ~where.forwards_first, 0.0, ds.bucket)
    return np.where(
        (ds.bucket > 0) & where.owns_head & (t.counts.head > 0) & ~np.asarray(t.held.main_grads),
        t.held.persistent
        + t.grads.grads_prev
        + (t.acts.total - t.acts.head)
        + t.grads.head_grad
        + new_bucket
        + t.temps.step_cache,
        0.0,
    )


def gradient_reduce(t: StageTerms):
    """DeepSpeed ZeRO-1/2, the backward's end: the last bucket flattened for its reduction; ZeRO-1 reduces its whole
    gradients only now, so those not yet in the bucket are still there. DeepSpeed's BF16 optimizer: its own
    reduction (`bf16_optimizer_reduce`)."""
    ds = t.held.ds
    zero_buckets = np.where(
        ds.bucket > 0,
        t.held.persistent
        + ds.bucket
        + ds.flat_copy
        + np.where(
            ds.stage1,
            np.maximum(ds.grads - ds.bucket, 0.0),
            np.where(t.position.accumulating | (ds.grads > ds.bucket), ds.partition, 0.0),
        ),
        0.0,
    )
    return np.maximum(zero_buckets, bf16_optimizer_reduce(t))


BF16_REDUCE_ELEMENTS = 5e8
"""DeepSpeed's MEMORY_OPT_ALLREDUCE_SIZE: the elements its fallback all-reduce gathers into one bucket."""


def bf16_optimizer_reduce(t: StageTerms):
    """DeepSpeed's BF16 optimizer after the step's last backward: the engine all-reduces its fp32 gradient buffers
    (one per parameter group: matrices, and the vectors without weight decay) in buckets that close once they pass
    BF16_REDUCE_ELEMENTS; a bucket of two buffers is concatenated (4 bytes an element; one alone is a view) and cast
    to bf16, the communication dtype (2 bytes), while the bf16 gradients are still there (deepspeed/runtime/engine.py,
    allreduce_bucket; traced on gloo ranks). Up to 5e8 parameters a stage both buffers share a bucket: 6 bytes a
    parameter; beyond, the matrices' buffer goes alone: 2 (counted on all of them, the vectors being few)."""
    n = trainable_per_device(t.job, t.stage)
    transient = np.where(n > BF16_REDUCE_ELEMENTS, 2.0, 6.0) * n
    return np.where(bf16_optimizer(t.job), t.held.persistent + t.held.grads_full + transient, 0.0)


def stage_reduce_scatter(t: StageTerms):
    """FSDP2 under a pipeline schedule, after the step's last backward: every whole gradient is still there while
    the first unit copies its own into the reduce-scatter input (the reduce dtype) and receives its shard. (Unlike
    a block's reduce-scatter inside the backward, no gloo clone shows here: measured on 4 gloo ranks,
    benchmarks/layouts.py's dp 2 x pp 2 ZeRO-2 rows.)"""
    g, counts, tp = t.gathered, t.counts, np.asarray(t.job.parallel.tp)
    root = np.where(t.position.owns_head, counts.head + counts.final, 0) + np.where(
        t.position.owns_embedding, counts.embedding + counts.positions, 0
    )
    unit = np.maximum(counts.per_layer, root) / tp * accumulated_grad_bytes(t.job)
    return np.where(
        pipelined_fsdp(t.job), t.held.persistent + t.held.grads_full + g.blocks + g.root + unit + t.held.step_grads, 0.0
    )


def _optimizer_temp_bytes(job: Job, largest_param: float, stage: str | None = None) -> float:
    """Temporaries of one optimizer step, in bytes."""
    name, impl = job.optimizer.name, optimizer_impl(job)
    if name in ("sgd", "adamw-8bit") or impl == "fused":  # (bitsandbytes updates its 8-bit states in place)
        return 0.0
    _tp, dp, zero = degrees(job)
    state = job.precision.plan.state_bytes
    shard = np.where(zero >= 1, dp, 1)  # the optimizer steps this rank's shard only
    n = trainable_per_device(job, stage) / shard
    if impl == "foreach":
        return n * state  # sqrt(v) for every tensor at once
    # ZeroRedundancyOptimizer (torch ZeRO-1) gives whole tensors to ranks; FSDP2 and DeepSpeed split them
    split = np.where((zero >= 2) | ((zero == 1) & job.precision.plan.master_weights), dp, 1)
    # sqrt(v) and its scaled copy, one tensor at a time; the loop's `denom` keeps the previous tensor's copy until
    # the next is made, which counts where the largest tensors follow each other (a block's grouped experts)
    copies = np.where(_experts_largest(job, largest_param), 3, 2)
    return copies * largest_param / split * state


def _experts_largest(job: Job, largest_param) -> bool:
    """The grouped experts' (experts / ep, h, f) tensors, consecutive in the model, are its largest."""
    m = job.model
    if not (m.has_shape and m.experts):
        return np.False_
    experts = m.experts / (np.asarray(job.parallel.ep) * job.parallel.etp) * m.hidden * m.expert_ffn_
    return experts >= np.asarray(largest_param) * np.asarray(job.parallel.tp)


def optimizer_step(t: StageTerms):
    """All gradients plus the optimizer's temporaries (for-loop: two copies of the largest tensor; foreach: one copy
    of every state tensor; fused: none) and, for mixed-*, the fp32 copies of the gradients the masters are stepped
    with; with offload the step runs on the host."""
    job, par, held = t.job, t.job.parallel, t.held
    persistent, grads_full = held.persistent, held.step_grads
    largest = np.maximum(max(t.counts.embedding, t.counts.head), largest_matrix(job)) / np.asarray(par.tp)
    if job.finetune.adapters:  # only the adapters are stepped
        largest = job.finetune.rank * max(job.model.hidden, job.model.ffn_, job.model.heads * job.model.head_dim_)
    step = persistent + grads_full + _optimizer_temp_bytes(job, largest, t.stage)
    ds32, masters = job_deepspeed_fp32(job), job.precision.plan.master_weights
    if masters or np.any(ds32):
        n = trainable_per_device(job, t.stage)
        dp = np.asarray(1 if par.dp is None else par.dp)
        # DeepSpeed steps one flat fp32 partition, made from its 16-bit gradient partition, which its engine keeps
        # through the step (ZeRO-1/2's contiguous buffer): a flat 16-bit copy cast to fp32 (in fp32 the copy is the
        # gradient), then the optimizer's temporaries, copies of the whole partition (for-loop: two, foreach: one,
        # fused: none). Traced on gloo ranks: a ZeRO-2 step held 2 bytes a parameter over dp more than the maximum
        # of the two had said. (Megatron's distributed optimizer, modelled only, shards its one gradient buffer in
        # place: nothing kept beside it.)
        flat = {"for-loop": 2, "foreach": 1, "fused": 0}[optimizer_impl(job)] if job.optimizer.name != "sgd" else 0
        partition = np.where(held.ds.fixed > 0, 0.0, held.ds.partition)  # (ZeRO-3's: in persistent)
        kept = np.where(is_megatron(job), 0.0, partition)
        cast_copy = np.where(ds32, 0.0, partition)
        deepspeed = persistent + kept + 4 * n / dp + np.maximum(cast_copy, flat * 4 * n / dp)
        replicas = np.where(held.main_grads, step, step + 4 * n - grads_full) if masters else step  # (fp32 copies
        step = np.where(np.asarray(par.zero) == 0, replicas, np.where(masters | ds32, deepspeed, step))  # of 16-bit)
    return np.where(np.asarray(par.offload) != "none", persistent + grads_full, step)  # offload: step on the host


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
