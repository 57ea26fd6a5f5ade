"""Saved activations of one micro-batch, per device, for the runner's GPT block (toolkit.program.model).

Every term below is a tensor that autograd keeps from forward to backward in that program,
named after the op that saves it, so a mismatch with the trace points at one line. Units:
T = micro-batch × sequence tokens, h hidden, q = heads × head_dim, kv = kv_heads × head_dim,
f = ffn width, a = heads, s = sequence, V = vocab.

Dtypes follow the precision mode:
- `fp32`: everything fp32;
- `amp-*` (autocast): linear outputs 16-bit, the residual stream and norms fp32; every
  linear saves its own 16-bit cast of its input (autocast caches casts of weights only, so
  q, k and v each cast the norm output) and the 16-bit cast of its weight;
- `pure-bf16`, `mixed-*` (16-bit weights): everything 16-bit but RMSNorm's internals
  (torch upcasts to fp32) and the log-softmax of the loss.

`program` says which kernels run. "cpu" is what the tracer measures: dropout keeps a mask
of the input's dtype, and SDPA with dropout falls back to the math path, which stores the
softmax, its dropout mask and the dropped probabilities. "cuda" keeps 1-byte dropout masks
and lets the flash kernel regenerate its dropout mask; it is modelled, not yet traced.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from ..specs.backends import is_megatron
from ..specs.job import TORCH_SEMANTICS, Job
from .activation_terms import (
    INT64_BYTES,
    ActivationBytes,
    attention_core,
    element_bytes,
    fsdp_gathers_16bit,
    loss_bytes,
    math_path,
    norm_internal,
    norm_output,
    rank_widths,
    stored_bytes,
)
from .lora_activations import lora_activations
from .mla import is_mla, projection_params
from .moe import activation_width, expert_grid, expert_load, is_moe
from .states import by_stage, job_stage_layers, vocab_per_rank

__all__ = ["ActivationBytes", "activation_bytes", "element_bytes", "fsdp_gathers_16bit", "pick", "pipeline_in_flight"]


def pick(choose_second, first, second):
    """Field by field, `second` where choose_second holds, else `first` (dataclasses of equal type)."""
    values = {
        f.name: np.where(choose_second, getattr(second, f.name), getattr(first, f.name))
        for f in dataclasses.fields(first)
    }
    return type(first)(**values)


def _norm_saved(job: Job, tokens: float, h: int, consumers: int, block: bool = True) -> float:
    """A norm's saved tensors, its input (the residual stream) included. With sequence parallelism the norm
    keeps its 1/tp of the tokens, and the linears after it keep the all-gathered output in torch's DTensor
    program; Megatron's (the mixed-* modes) keeps the shard and gathers it again in backward."""
    tokens_h = np.where(job.parallel.sp, tokens / job.parallel.tp, tokens)
    gathered = tokens if job.precision.mode in TORCH_SEMANTICS else tokens_h
    return norm_internal(job, tokens_h, h, block) + norm_output(job, gathered, h, consumers, block)


def activation_bytes(job: Job, stage: str | None = None, stages_after=None) -> ActivationBytes:
    """Saved activations on one device of a resolved job: the first or last pipeline stage, or (None) the one
    that holds more. Without pipelining every stage is the whole model. `stages_after` places a middle stage
    ("second") elsewhere: how many stages follow it (the second's is pp − 2)."""
    if job.finetune.adapters:
        return lora_activations(job)
    if stage is None:
        first, last = activation_bytes(job, "first"), activation_bytes(job, "last")
        busier = pick(last.total > first.total, first, last)
        if np.all(np.asarray(job.parallel.pp) <= 2):
            return busier
        second = activation_bytes(job, "second")
        return pick((np.asarray(job.parallel.pp) > 2) & (second.total > busier.total), busier, second)
    return _on_stage(job, stage, stages_after, _mean_block(job))


def _mean_block(job: Job) -> _Block:
    """What one block saves; a Mixture of Experts whose first blocks are dense (DeepSeek) saves the mean of its
    blocks' (exact for the whole model's total; a pipeline's first stage holds the dense ones, which errs there by
    the difference)."""
    m = job.model
    moe = _block(job)
    if not is_moe(m) or not m.dense_layers:
        return moe
    dense_model = dataclasses.replace(m, experts=0, experts_per_token=0, shared_experts=0, dense_layers=0)
    dense = _block(dataclasses.replace(job, model=dense_model))
    share = m.dense_layers / m.layers
    return _Block(
        **{
            f.name: getattr(moe, f.name) * (1 - share) + getattr(dense, f.name) * share
            for f in dataclasses.fields(_Block)
        }
    )


@dataclass(frozen=True)
class _Block:
    """What one transformer block saves for backward, per micro-batch on one rank."""

    none: object  # without recompute
    per_layer: object  # under the job's recompute
    recompute_layer: object  # what backward rebuilds of one block at a time (full recompute)
    weights: object  # autocast's 16-bit weight casts, which a stage's micro-batches share
    stream: object  # one residual-stream tensor (the block's input)
    tokens: object  # tokens of the micro-batch on this rank (context parallelism: its share)


def _block(job: Job) -> _Block:
    m = job.model
    act, residual, amp = element_bytes(job)
    h, q, kv, f = rank_widths(job)
    b, s = job.batch.micro_batch, m.seq_len
    tokens = b * s / job.parallel.cp  # context parallelism: each rank keeps its share of a sequence
    tp = job.parallel.tp
    # tokens of the h-wide tensors (norms, residual stream, branch dropout) on one rank: all of them,
    # or 1/tp with sequence parallelism (Korthikanti et al. 2022)
    tokens_h = np.where(job.parallel.sp, tokens / tp, tokens)
    # dropout keeps a mask of its input's dtype on CPU (1 byte on CUDA): branch outputs are `act`
    branch_mask = tokens_h * h * (stored_bytes(job, act) if job.memory.program == "cpu" else 1) if m.dropout > 0 else 0
    rope = m.position == "rope"
    act_b, half_b = stored_bytes(job, act), stored_bytes(job, 2)  # a block's tensors (int8 when compressed)
    norm1 = _norm_saved(job, tokens, h, consumers=3)  # its input is the block input
    core = attention_core(job, tokens, b)
    # fp32 cos/sin tables cast per use (FSDP2 casts parameters, not buffers): two 16-bit tables, twice
    rope_casts = 2 * half_b * s * (m.head_dim_ // 2) * 2 * (rope & (amp | fsdp_gathers_16bit(job)))
    # o's input is a view of the core output when q kept the linear's (b, s, a, d) layout, else a copy;
    # int8 packs the view apart from the core's own saved output (another shape), so it counts again
    # (Transformer Engine's projection keeps the core's output itself: Megatron-Core never copies it)
    te = is_megatron(job)  # Megatron-Core keeps what Transformer Engine's fused modules save
    o_input_copy = (math_path(job) or rope or job.memory.act_compress == "int8") & ~te
    o_input = tokens * q * act_b
    mlp_readers = 2 if m.mlp == "swiglu" else 1  # the linears reading the norm's output (autocast casts it for each)
    if is_moe(m):  # the router, and the shared experts' first linears (the experts read the gathered rows)
        mlp_readers = 1 + (mlp_readers if m.shared_experts else 0)
    norm2 = _norm_saved(job, tokens, h, consumers=mlp_readers)  # input: x + attention
    # SwiGLU: torch keeps gate, up, silu(gate) and the product; Megatron's fused SwiGLU keeps its 2f input and
    # the f-wide output the down projection reads (megatron/core/fusions/fused_bias_swiglu.py)
    mlp = np.where(m.mlp == "swiglu", np.where(te, 3, 4), 2) * tokens * f * act_b
    # autocast saves a 16-bit cast of every matmul weight (a new tensor, so int8 compresses it too)
    mlp_weights = _moe_weights(job) if is_moe(m) else (3 if m.mlp == "swiglu" else 2) * h * f
    weights = amp * half_b * (projection_params(m) / tp + mlp_weights)
    common = norm1 + rope_casts + norm2 + mlp + 2 * branch_mask + weights
    if is_moe(m):
        common = common + _moe_saved(job, tokens / expert_grid(job).token_split)  # (its tp share on a grid)
    if is_mla(m):  # the query's and the key-value latents, and their norms' outputs (modelled, not traced)
        latents = (m.q_lora_rank or 0) + m.kv_lora_rank + m.rope_head_dim
        common = common + 2 * tokens * latents * act_b
    none = common + core + np.where(o_input_copy, o_input, 0.0)
    recompute = np.asarray(job.memory.recompute)
    full, per_op = recompute == "full", recompute == "selective-op"
    stream = tokens_h * h * residual
    # the checkpointed core keeps its inputs (q after rope, k and v before the GQA repeat); o keeps the core output
    # (a view of it, or its copy)
    core_inputs = tokens * (q + 2 * kv) * act_b
    selective = common + core_inputs + o_input
    if job.memory.recompute_modules is not None:  # Megatron's --recompute-modules: each part keeps its input only
        parts = {"layernorm": norm1 + norm2 - 2 * stream, "mla_up_proj": core_inputs if is_mla(m) else 0.0}
        parts |= _mlp_parts(job, mlp, tokens / expert_grid(job).token_split)
        modules = set(job.memory.recompute_modules)
        selective = (selective if "core_attn" in modules else none) - sum(parts.get(k, 0.0) for k in modules)
    per_layer = np.select(
        [full, recompute == "selective", per_op],
        [stream, selective, stream + _kept_by_op_policy(job, tokens, b)],  # (full: the block input only)
        none,
    )
    # the recomputed block re-creates all it saves but what the checkpoint already holds
    return _Block(
        none=none,
        per_layer=per_layer,
        recompute_layer=np.where(full | per_op, none - per_layer, 0),
        weights=weights,
        stream=stream,
        tokens=tokens,
    )


def _mlp_parts(job: Job, mlp, moe_tokens) -> dict:
    """What the MLP's recomputable parts save: its activation function's outputs (half of a SwiGLU's four
    f-wide tensors, GELU's one of two), the shared experts' share, the whole MLP (dense) or MoE block."""
    m = job.model
    # the activation's output: half of torch's four f-wide SwiGLU tensors, one of Megatron's three, GELU's one of two
    act_share = np.where((m.mlp == "swiglu") & is_megatron(job), 1 / 3, 0.5)
    if not is_moe(m):
        return {"mlp": mlp, "moe_act": 0.0, "moe": 0.0, "shared_experts": 0.0}
    shared = m.shared_experts * m.shared_expert_ffn_ / activation_width(m, expert_load(m, job.parallel.ep))
    return {
        "mlp": 0.0,
        "moe_act": mlp * act_share,
        "moe": mlp + _moe_saved(job, moe_tokens),
        "shared_experts": mlp * shared,
    }


def _moe_saved(job: Job, tokens) -> float:
    """What an MoE block saves beyond its experts' inner tensors (those are the MLP's, at activation_width): the
    router's fp32 scores (softmax or sigmoid output), each token's k expert ids, weights and their sum, the
    permutation's int64 indices (gather and inverse), the experts' input rows at the busiest rank's load (a 16-bit
    cast per expert matmul that reads them, under autocast), the experts' outputs back in slot order (kept to weight
    them; not in Megatron-Core, which weights inside the SwiGLU), and under expert parallelism the regrouping
    indices of what arrived (toolkit.program.moe)."""
    m, ep = job.model, np.asarray(job.parallel.ep)
    act, _residual, amp = element_bytes(job)
    load = expert_load(m, ep, for_memory=True)
    k, h = m.experts_per_token, m.hidden
    slots = tokens * k
    router = tokens * m.experts * 4 + slots * (INT64_BYTES + 4 + 4) + tokens * 4 + 2 * slots * INT64_BYTES
    readers = np.where(amp, 2 if m.mlp == "swiglu" else 1, 1)
    rows = slots * load * h * np.where(amp, 2 * readers, act)
    regroup = np.where(ep > 1, 2 * slots * load * INT64_BYTES, 0.0)
    # Megatron-Core weights each slot inside its SwiGLU (the probabilities join the activation, Megatron !2668,
    # 2025-04) and unpermutes without them, so no slot-order copy of the outputs stays for backward
    slot_outputs = np.where(is_megatron(job), 0.0, slots * h * act)
    return router + rows + slot_outputs + regroup


def _moe_weights(job: Job) -> float:
    """An MoE block's matrices autocast casts (and keeps) per step: the router's, the shared experts' and this rank's
    routed experts' (one grouped cast each)."""
    m = job.model
    mats = 3 if m.mlp == "swiglu" else 2
    routed = m.experts / (np.asarray(job.parallel.ep) * job.parallel.etp) * mats * m.hidden * m.expert_ffn_
    return m.hidden * m.experts + mats * m.hidden * m.shared_experts * m.shared_expert_ffn_ + routed


def _kept_by_op_policy(job: Job, tokens: float, b: int) -> float:
    """Per-op selective recompute (torchtitan's "op" policy, toolkit.program.model): beside the block input, the
    outputs of the block's 1st, 3rd, ... matmul in call order (q, k, v, o, then gate, up, down or up, down: q, v,
    the MLP's first and SwiGLU's down) and the fused attention kernel's output and fp32 log-sum-exp. A row-parallel
    matmul (o, down) outputs all tokens at full width, before its reduction."""
    act = element_bytes(job)[0]
    h, q, kv, f = rank_widths(job)
    widths = [q, kv, kv, h] + ([f, f, h] if job.model.mlp == "swiglu" else [f, h])
    matmuls = tokens * sum(widths[::2]) * act
    heads, rows = job.model.heads // np.asarray(job.parallel.tp), job.model.seq_len / job.parallel.cp
    fused = 0 if math_path(job) else tokens * q * act + b * heads * rows * 4
    return matmuls + fused


def _on_stage(job: Job, stage, stages_after, block: _Block) -> ActivationBytes:
    """A stage's activations: its blocks times the micro-batches in flight, the embedding's and the head's, and
    the pipeline schedule's buffers.

    Pipelines follow torch.distributed.pipelining (the mixed-* modes: Megatron's, which frees a sent output's
    data, reuses its receive buffers and computes the loss inside the last stage). torch's schedule keeps the last
    stage's output (the logits) until that micro-batch's backward; every other chunk keeps the output it sent on;
    under 1F1B (interleaved or not) each chunk also holds one residual-stream-sized buffer per micro-batch of the
    step for what it receives: inputs (all but the model's first chunk) and gradients (all but the last), beside
    what its blocks keep (measured on torch's Schedule1F1B and ScheduleInterleaved1F1B; GPipe's buffers are the
    blocks' inputs themselves)."""
    m, par, tokens = job.model, job.parallel, block.tokens
    h, tp, s = m.hidden, par.tp, m.seq_len
    residual = element_bytes(job)[1]
    embedding_mask = (
        np.where(par.sp, tokens / tp, tokens) * h * (residual if job.memory.program == "cpu" else 1) * (m.dropout > 0)
    )  # the embedding output's dropout mask: the residual stream's dtype on CPU
    embedding = tokens * INT64_BYTES + (s * INT64_BYTES if m.position == "learned" else 0) + embedding_mask
    head = _norm_saved(job, tokens, h, consumers=1, block=False) + loss_bytes(job, tokens, vocab_per_rank(m, tp))
    single = np.asarray(par.pp) == 1
    full = np.asarray(job.memory.recompute) == "full"
    micro_batches = np.asarray(1 if job.grad_accum is None else job.grad_accum)
    gpipe = np.asarray(par.schedule) == "gpipe"
    in_flight = pipeline_in_flight(job, stage, stages_after)
    owns_embedding, owns_head = single | (stage == "first"), single | (stage == "last")
    stage_layers = by_stage(stage, *job_stage_layers(job))
    torch_pipeline = ~single & (job.precision.mode in TORCH_SEMANTICS)
    kept_logits = np.where(torch_pipeline, tokens * vocab_per_rank(m, tp) * job.precision.plan.compute_bytes, 0.0)
    # the checkpointed programs keep no weight cast: full and per-op recompute cast again in backward
    checkpointed = full | (np.asarray(job.memory.recompute) == "selective-op")
    shared = np.where(single | checkpointed, 0.0, block.weights)
    shared_head = np.where(single | ~np.asarray(owns_head), 0.0, element_bytes(job)[2] * 2 * h * vocab_per_rank(m, tp))
    vpp = np.asarray(par.vpp)
    chunk_forwards = in_flight * vpp  # chunk forwards alive at once on this rank
    heads = np.where(owns_head, np.where(gpipe, micro_batches, 1.0), 0.0)
    kept_output = np.where(torch_pipeline, (chunk_forwards - heads) * block.stream, 0.0)
    receiving = (vpp - owns_embedding) + (vpp - owns_head)  # chunks receiving inputs, and gradients
    buffers = np.where(torch_pipeline & ~gpipe, micro_batches * receiving * block.stream, 0.0)
    kept_output = kept_output + buffers
    # torch's interleaved schedule waits for its sends only when the step ends: every output and input gradient
    # a chunk sent stays until then, as many as the receive buffers by the last backward. Its peak is the last
    # backward of the steady phase: every forward has run, and beside the outputs still in flight (above) it holds
    # the ones it sent and already differentiated, and the input gradients those backwards sent (measured per
    # chunk on ScheduleInterleaved1F1B: the held bytes grow by these through the steady phase)
    differentiated = np.maximum(micro_batches * vpp - chunk_forwards, 0)
    sent_held = (
        micro_batches * (vpp - owns_head) - (chunk_forwards - heads) + differentiated * (vpp - owns_embedding) / vpp
    )
    kept_output = kept_output + np.where(torch_pipeline & (vpp > 1), np.maximum(sent_held, 0) * block.stream, 0.0)
    step_end_buffers = np.where(vpp > 1, 2 * buffers, 0.0)
    per_layer = block.per_layer
    return ActivationBytes(
        per_layer=per_layer,
        layers=((per_layer - shared) * in_flight + shared) * stage_layers + kept_output,
        shared_per_layer=shared,
        shared_head=shared_head,
        embedding=np.where(owns_embedding, embedding * in_flight, 0.0),
        head=np.where(owns_head, head + kept_logits, 0.0),
        recompute_layer=block.recompute_layer,
        in_flight=in_flight,
        stage_layers=stage_layers,
        heads_held=heads,
        step_end_buffers=step_end_buffers,
    )


def pipeline_in_flight(job: Job, stage: str | None = "first", stages_after=None) -> float:
    """Micro-batches whose activations a pipeline stage ("first", "second" or "last") holds at once, in
    stage-layer units.

    GPipe keeps all m micro-batches of a step; 1F1B at most p on the first stage and one on the last
    (Narayanan et al. 2021). Interleaved over v chunks, a rank runs its warm-up forwards, (v − 1)·r
    (r = p when p divides m) plus 2 per stage after it, and one more before its first backward, each
    1/v of its layers: p + (p − 1)/v on the first stage (Megatron-LM's p·(1 + (p−1)/(p·v))), and
    ((v − 1)·p + 1)/v on the last; torch's ScheduleInterleaved1F1B and Megatron warm up alike.
    """
    p, v = np.asarray(job.parallel.pp), np.asarray(job.parallel.vpp)
    m = np.asarray(1 if job.grad_accum is None else job.grad_accum)
    per_round = m // np.maximum(1, m // p)  # torch: rounds of p micro-batches, or one round of m
    after = p - 1 if stage is None else by_stage(stage, p - 1, p - 2, 0)  # stages after this one
    if stages_after is not None:
        after = np.asarray(stages_after)
    interleaved = np.minimum((v - 1) * per_round + 2 * after + 1, m * v) / v
    one_f_one_b = np.where(v > 1, interleaved, np.minimum(m, after + 1))
    in_flight = np.where(np.asarray(job.parallel.schedule) == "gpipe", m, one_f_one_b)
    return np.where(p == 1, 1.0, in_flight)
