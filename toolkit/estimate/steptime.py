"""How long one optimizer step takes on the busiest device, and where the time goes.

    st = step_time(job, hardware_for(job, catalog))
    st.step_s, st.tokens_per_s, st.mfu, st.breakdown()

The step is built from parts, each from a published formula or a stated assumption:

- compute: the job's hardware FLOPs per device (at the FP8 peak with `precision.fp8`; MFU stays
  stated against the 16-bit peak, as published FP8 runs report it) (toolkit.estimate.flops, recompute included) at
  the accelerator's dense peak times a matrix-shape efficiency: every matmul of a block is put on
  a roofline (FLOPs at `gemm_fraction` of peak, or its operand bytes at HBM bandwidth, whichever
  is slower), so thin matrices (small micro-batches, wide tensor parallelism) run below peak;
- memory-bound ops (norms, activations, residual adds, RoPE, eager attention's scale, mask and softmax):
  the bytes they read and write at HBM bandwidth;
- tensor parallelism: 2 all-reduces of the block's activations in forward, 2 in backward
  (Megatron; torch's DTensor plan without sp: one per column-parallel layer), plus 2 per recomputed
  forward, the embedding's and the head's, and the vocabulary-parallel loss's three small ones;
  hidden behind the matmuls only with overlap.tp_comm;
- context parallelism: each rank keeps seq/cp tokens; a ring passes keys and values, hidden
  behind the attention products where they are long enough;
- data parallelism as each backend runs it (`data_parallel_s`): DDP and Megatron reduce once a
  step, FSDP2 and DeepSpeed ZeRO-2/3 every micro-batch; ZeRO-3 gathers parameters every
  micro-batch, ZeRO-1/2 once after the step. What hides behind backward or forward, bucket by
  bucket (the last bucket always shows, each pays the collective's latency: why 2–8 MB buckets
  beat one bucket and beat tiny ones), is job.overlap, each backend's default when unset;
- pipelines: each rank's time is its blocks (and on the last the output projection); the busiest
  runs every micro-batch, the others' times fill and drain the pipe ((p−1)/v stage times when the
  stages are equal), plus the point-to-point sends;
- the optimizer step: its state bytes read and written at HBM bandwidth (on the host with offload,
  plus the PCIe transfers of gradients and parameters).

Collectives cross the intra-node link when the group fits in a node (tp innermost, then cp, dp,
then pp, as Megatron places ranks), else each device gets its share of the node's network. The figures
marked as assumptions below are not published per device; `benchmarks/steptime_checks.py`
compares the resulting MFU with published runs. Every function accepts array-valued layouts.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from ..specs.job import Job
from .comm import (
    TP_HEAD_COLLECTIVES,
    TP_LOSS_COLLECTIVES,
    backends,
    bus_bw_bytes_per_s,
    data_parallel_s,
    is_megatron,
    latency_s,
    overlap_settings,
    ring_attention_s,
    ring_s,
    tp_collectives_per_block,
    tp_embedding_collectives,
)
from .elementwise import dequant_bytes_per_block, loss_bytes_per_token, memory_bound_bytes_per_token
from .flops import flops_per_token, module_recompute_flops
from .hardware import Assumptions, Hardware
from .kernels import FA_BACKWARD_FACTOR, KernelProfile, attention_fraction, attention_kernel_of, gemm_s
from .mla import projection_shapes
from .moe import (
    GROUPED_GEMM_HALF_ROWS,
    expert_grid,
    expert_load,
    expert_rows,
)
from .moe_time import all_to_all_per_block_s, exposed_ep_s
from .overhead import fixed_costs_s, host_s, op_units
from .phases import optimizer_impl
from .states import (
    adapter_params_per_layer,
    bytes_per_param,
    job_params_per_device,
    job_stage_layers,
    model_state_bytes,
)
from .steptime_result import StepTime, scaled

__all__ = [
    "StepTime",
    "step_time",
    "block_matmul_shapes",
    "op_units",
    "thin_factor",
]


UNFUSED_OPTIMIZER_FACTOR = 1.5
"""Memory traffic of an unfused (foreach or per-tensor) optimizer step over a fused one, which reads and writes each
state once: the unfused step re-reads its temporaries. Assumed (a middle figure; the step is a small share of a
large model's time)."""


def _roofline_s(m, k, n, elem: float, hw: Hardware, a: Assumptions):
    """One matmul (m×k)·(k×n): FLOP-bound at gemm_fraction of peak (slower where a dimension is thin), or bound by
    moving its operands."""
    return np.maximum(
        2.0 * m * k * n * thin_factor(m, k, n, a.gemm_half_size) / (hw.gemm_peak * a.gemm_fraction),
        elem * (m * k + k * n + m * n) / hw.memory_bw_bytes_per_s,
    )


def thin_factor(m, k, n, half_size: float):
    """How much longer a product of (m×k)·(k×n) takes than its FLOPs at the large-matrix rate: each dimension x
    runs at x / (x + half_size) of it (Assumptions.gemm_half_size)."""
    return (1 + half_size / m) * (1 + half_size / k) * (1 + half_size / n)


def block_matmul_shapes(job: Job) -> list[tuple]:
    """(m, k, n) of one block's matmuls on one tensor-parallel rank, one micro-batch: q, k, v, o and the MLP's
    (toolkit calibrate measures the same shapes). Layout fields may be arrays."""
    m = job.model
    tp = np.asarray(job.parallel.tp)
    tokens = np.asarray(job.batch.micro_batch) * m.seq_len
    h, f = m.hidden, m.ffn_ / tp
    if m.experts:  # an MoE block's dense MLP is its shared experts (the routed ones: _expert_efficiency)
        f = m.shared_experts * m.shared_expert_ffn_
    *columns, (o_in, o_out) = projection_shapes(m)  # column-parallel projections, then the row-parallel output
    shapes = [(tokens, i, o / tp) for i, o in columns] + [(tokens, o_in / tp, o_out)]
    if not m.experts or f:
        shapes += [(tokens, h, f), (tokens, f, h)] + ([(tokens, h, f)] if m.mlp == "swiglu" else [])
    return shapes


def _gemm_efficiency(job: Job, hw: Hardware, a: Assumptions, shapes=None):
    """FLOPs of a block's matmuls (or of `shapes`) divided by their time, as a share of peak: with a kernel
    profile, each product's forward, input-gradient and weight-gradient shapes priced as the device runs them
    (`kernels.gemm_s`); else on the roofline at gemm_fraction."""
    elem = job.precision.plan.compute_bytes
    shapes = block_matmul_shapes(job) if shapes is None else shapes
    if hw.kernels is not None:
        prof = hw.kernels
        if hw.matmul_peak_flops and prof.gemm_fraction_fp8:  # FP8 matmuls at FP8's own achieved share
            prof = dataclasses.replace(prof, gemm_fraction=prof.gemm_fraction_fp8)
        flops = sum(3 * 2.0 * x * y * z for x, y, z in shapes)

        def run(m, k, n):  # noqa: E306
            return gemm_s(m, k, n, hw.gemm_peak, hw.memory_bw_bytes_per_s, elem, prof)

        seconds = sum(run(x, y, z) + run(x, z, y) + run(y, x, z) for x, y, z in shapes)  # forward, dgrad, wgrad
        return flops / (seconds * hw.gemm_peak)
    flops = sum(2.0 * x * y * z for x, y, z in shapes)
    seconds = sum(_roofline_s(x, y, z, elem, hw, a) for x, y, z in shapes)
    return flops / (seconds * hw.gemm_peak)


def _expert_efficiency(job: Job, hw: Hardware, a: Assumptions, tokens):
    """Share of peak one MoE block's routed experts reach: each local expert's product of its rows (tokens · k · ep
    / experts, thin) by its matrices, as a kernel profile prices those shapes, or on the roofline slowed by the
    rows as a grouped GEMM is (toolkit.estimate.moe.GROUPED_GEMM_HALF_ROWS)."""
    m, grid = job.model, expert_grid(job)
    etp = np.asarray(job.parallel.etp)
    rows = expert_rows(m, tokens / grid.token_split * etp, job.parallel.ep)  # an etp group gathers its tokens
    width = m.expert_ffn_ / etp
    mats = [(rows, m.hidden, width), (rows, width, m.hidden)]
    mats += [(rows, m.hidden, width)] if m.mlp == "swiglu" else []
    eff = _gemm_efficiency(job, hw, a, mats)
    return eff if hw.kernels is not None else eff * rows / (rows + GROUPED_GEMM_HALF_ROWS)


def _attention_efficiency(job: Job, hw: Hardware, a: Assumptions):
    """Share of peak the attention core's products reach. A fused (flash) kernel keeps the score matrix on
    chip and runs compute-bound; an eager core writes and reads the s×s scores of every head, so q·kᵀ and
    probs·v are two batched matmuls with an inner or outer dimension of one head (d = 64–128): on an A100
    (ridge ~150 FLOP/byte in 16 bits) they are bound by memory, not by FLOPs."""
    if job.memory.attention != "eager" and hw.kernels is not None:
        return _fused_attention_fraction(job, hw.kernels)
    if job.memory.attention != "eager":
        return a.gemm_fraction if a.attention_fraction is None else a.attention_fraction
    m = job.model
    s, d = m.seq_len, m.head_dim_
    elem = job.precision.plan.compute_bytes
    flops = 2 * (2.0 * s * s * d)  # q·kᵀ and probs·v of one head
    seconds = _roofline_s(s, d, s, elem, hw, a) + _roofline_s(s, s, d, elem, hw, a)
    return flops / (seconds * hw.gemm_peak)


def _fused_attention_fraction(job: Job, prof: KernelProfile):
    """Share of peak of the fused attention each layout's backend runs here, forward and backward, at the
    sequence each rank attends over (seq / cp)."""
    m = job.model
    seq = m.seq_len / np.asarray(job.parallel.cp)
    causal = not m.encoder
    megatron, deepspeed, _torch = backends(job)
    chosen = job.memory.attention_kernel
    rate = {
        b: attention_fraction(prof, attention_kernel_of(prof, b, chosen), seq, m.head_dim_, causal)
        for b in ("torch", "megatron", "deepspeed")
    }
    return np.where(megatron, rate["megatron"], np.where(deepspeed, rate["deepspeed"], rate["torch"]))


def _compute_s(job: Job, hw: Hardware, a: Assumptions, tokens, eff):
    """(one block, the vocabulary projection): seconds of the matmuls a device runs on `tokens` tokens (its share
    under tp); projections and MLP at the shapes' roofline efficiency `eff`, the attention products at theirs,
    recomputed forwards included; and the attention products alone (what a context-parallel ring hides behind)."""
    eager = job.memory.attention == "eager"
    tf = flops_per_token(job, causal=not eager)  # an eager core multiplies the whole (masked) matrix
    recompute = np.asarray(job.memory.recompute)
    megatron = is_megatron(job)  # its checkpoint reruns a whole region; torch's stops at the last product
    core_again = np.where(megatron, tf.attention, tf.attention / 2 if eager else tf.attention)  # nothing saved
    # per-op recompute reruns an eager core whole (o needs its output); a fused kernel's output is saved
    op_core = 0.0 if job.memory.attention == "flash" else tf.attention
    modules = job.memory.recompute_modules
    if modules is not None and "core_attn" not in modules:  # Megatron's module list without the attention core
        core_again = 0.0
    attn_recompute = np.select(
        [recompute == "full", recompute == "selective", recompute == "selective-op"],
        [tf.attention, core_again, op_core],
        0.0,
    )
    # the other modules' matmuls (toolkit.estimate.flops.module_recompute_flops), once more forward
    dense_again, experts_again = (np.where(recompute == "selective", x, 0.0) for x in module_recompute_flops(job))
    proj_recompute = np.select(
        [recompute == "full", recompute == "selective-op"],
        [np.where(megatron, tf.layer_matmuls, tf.recompute - tf.attention), tf.recompute - op_core],
        0.0,
    )
    scale = tokens / np.asarray(job.parallel.tp) / hw.gemm_peak
    # FP8 runs the linear layers only (Transformer Engine): the attention products stay at the 16-bit peak. A
    # measured fused kernel's rate is in FlashAttention's count (backward 2.5× the forward); else 2×
    passes = 1 + (FA_BACKWARD_FACTOR if hw.kernels is not None and job.memory.attention != "eager" else 2.0)
    attention_s = (
        tokens
        / np.asarray(job.parallel.tp)
        / hw.peak_flops
        * passes
        * tf.attention
        / job.model.layers
        / _attention_efficiency(job, hw, a)
    )
    # frozen weights (LoRA, QLoRA) need no weight gradient: forward and input gradient only (the adapters' own
    # products are a rank-r sliver, left out)
    passes_w = 2 if job.finetune.adapters else 3
    # a Mixture of Experts' routed experts: at their own (thin) shapes, on the busiest rank's load, on the tokens
    # this rank sends (all of them where the experts are whole on every tensor-parallel rank, its tp share on the
    # experts' own grid: toolkit.estimate.moe.expert_grid); recompute repeats them in the share they have
    expert_share = tf.experts / tf.layer_matmuls
    dense = (passes_w * tf.layer_matmuls + proj_recompute) * (1 - expert_share) + dense_again
    block_s = scale * dense / job.model.layers / eff + attention_s * (1 + attn_recompute / (passes * tf.attention))
    if tf.experts:
        load = expert_load(job.model, job.parallel.ep)
        expert_work = ((passes_w * tf.layer_matmuls + proj_recompute) * expert_share + experts_again) * load
        sent = tokens / expert_grid(job).token_split
        block_s = block_s + sent / hw.gemm_peak * expert_work / job.model.layers / _expert_efficiency(
            job, hw, a, tokens
        )
    return block_s, scale * passes_w * tf.head / eff, attention_s


def step_time(job: Job, hw: Hardware, a: Assumptions | None = None) -> StepTime:
    """Seconds of one optimizer step of a resolved job (layout fields may be numpy arrays). `a`: the figures
    no datasheet gives; default the device's measured ones (hw.assumptions), else Assumptions()."""
    a = a or hw.assumptions or Assumptions()
    m, par = job.model, job.parallel
    dp, tp, pp, cp = (np.asarray(x) for x in (par.dp, par.tp, par.pp, par.cp))
    micro = np.asarray(job.batch.micro_batch)
    accum = np.maximum(job.batch.global_batch // (micro * dp), 1)  # invalid layouts (0) are filtered by the grid
    tokens_step = job.batch.global_batch * m.seq_len
    per_token = flops_per_token(job)
    eff = _gemm_efficiency(job, hw, a)
    micro_tokens = micro * m.seq_len

    first, middle, last = job_stage_layers(job)
    parts = _stage_micro_s(job, hw, a, eff, micro_tokens, (first, middle, last), accum)
    totals = [sum(p) for p in parts]
    busiest = _busiest_stage(totals, pp)
    pick = lambda i: np.choose(busiest, [p[i] for p in parts])  # noqa: E731
    compute_s, memory_s, tp_s, cp_s, ep_s = (pick(i) * accum for i in range(5))
    pick_layers = np.choose(busiest, [first, middle, last])
    per_micro_s = np.choose(busiest, totals)
    bubble_s, pp_s = _pipeline_s(job, hw, a, totals, per_micro_s, accum, micro_tokens)
    owns_head = (pp == 1) | (busiest == 2)
    overhead_s = _overhead_s(job, hw, a, pick_layers, accum, owns_head, compute_s + memory_s + tp_s)

    # ---- data parallel / ZeRO: over dp × cp (context-parallel ranks hold the same weights) ----------------
    trainable = _trainable(job)
    dp_s, exposed = data_parallel_s(
        job, hw, a, trainable, dp * cp, tp, accum, (compute_s + memory_s) / accum, np.maximum(pick_layers, 1)
    )
    optimizer_s = _optimizer_s(job, hw, a, trainable, dp * cp)

    st = StepTime(
        compute_s=compute_s,
        memory_bound_s=memory_s,
        overhead_s=overhead_s,
        tp_comm_s=tp_s,
        cp_comm_s=cp_s,
        dp_comm_exposed_s=exposed,
        pp_comm_s=pp_s,
        bubble_s=bubble_s,
        optimizer_s=optimizer_s,
        model_flops=per_token.model * tokens_step,
        tokens=tokens_step,
        devices=job.cluster.count,
        peak_flops=hw.peak_flops,
        gemm_efficiency=eff,
        dp_comm_s=dp_s,
        stage_micro_s=tuple(totals),
        ep_comm_s=ep_s,
    )
    return scaled(st, hw.step_scale, hw.communication_scale)


def _p2p_bw_bytes_per_s(hw: Hardware, a: Assumptions, inside):
    """A point-to-point send's bandwidth: the node's links inside a node, the network across nodes."""
    return np.where(inside, hw.intra_bw_bytes_per_s * a.link_efficiency, hw.inter_bw_bytes_per_s * a.network_efficiency)


def _block_activation_bytes(job: Job, micro_tokens):
    """One block's activation of this rank's tokens: what a tp all-reduce and a pipeline send carry."""
    cp = np.asarray(job.parallel.cp)
    return micro_tokens / cp * job.model.hidden * job.precision.plan.compute_bytes


def _tp_collectives_s(job: Job, hw: Hardware, a: Assumptions, micro_tokens):
    """Tensor parallel, one micro-batch: an all-reduce of the block's activation, a block's all-reduces as the
    backend runs them (toolkit.estimate.comm.tp_collectives_per_block), and the vocabulary-parallel loss's three
    one-float-per-token reductions."""
    tp, cp = np.asarray(job.parallel.tp), np.asarray(job.parallel.cp)
    tp_bus = bus_bw_bytes_per_s(tp, 1, hw, a)
    fixed_s = (
        latency_s(tp, 1, hw.gpus_per_node, a) if a.tp_collective_s is None else np.where(tp > 1, a.tp_collective_s, 0.0)
    )
    allreduce_s = ring_s(2.0, _block_activation_bytes(job, micro_tokens), tp, tp_bus) + fixed_s
    block_s = allreduce_s * tp_collectives_per_block(job)
    loss_s = TP_LOSS_COLLECTIVES * (ring_s(2.0, micro_tokens / cp * 4, tp, tp_bus) + fixed_s)
    return allreduce_s, block_s, loss_s


def _stage_micro_s(job: Job, hw: Hardware, a: Assumptions, eff, micro_tokens, layers: tuple, accum=1) -> list[tuple]:
    """One micro-batch on the first, middle and last pipeline ranks (without pipelining all three are one): each
    rank's (matmuls, memory-bound, exposed tp, cp ring, ep all-to-all) seconds. Groups sit tp innermost, then cp,
    dp, pp (Megatron's order); the embedding's and the head's extra work goes to the ranks that hold them."""
    tp, pp, cp = (np.asarray(x) for x in (job.parallel.tp, job.parallel.pp, job.parallel.cp))
    tp_allreduce_s, tp_layer_s, tp_loss_s = _tp_collectives_s(job, hw, a, micro_tokens)
    # a torch program on a GPU runs its element-wise ops kernel by kernel unless its blocks are compiled, where
    # inductor fuses them as Megatron's and DeepSpeed's fused kernels do (tests/estimate/test_compile_bytes.py)
    eager = (hw.kernels is not None) & ~is_megatron(job) & ~backends(job)[1] & (not job.training.compile)
    bytes_layer = memory_bound_bytes_per_token(job, eager) * micro_tokens / cp + dequant_bytes_per_block(job)
    loss_s = loss_bytes_per_token(job) * micro_tokens / cp / hw.memory_bw_bytes_per_s
    single = pp == 1
    block_s, head_s, attention_s = _compute_s(job, hw, a, micro_tokens / cp, eff)
    cp_inside = tp * cp <= hw.gpus_per_node
    cp_ring_s = ring_attention_s(job, a, micro_tokens, attention_s, _p2p_bw_bytes_per_s(hw, a, cp_inside))
    ep_layer_s = all_to_all_per_block_s(job, hw, a, micro_tokens / cp)
    overlap_tp = overlap_settings(job)["tp_comm"]
    overlap_ep = np.asarray(job.overlap.ep_comm)
    sustained = hw.kernels.sustained_fraction if hw.kernels is not None else 1.0
    power = hw.kernels.power_limited_fraction if hw.kernels is not None else 1.0  # clocks at the power limit

    def stage(layers, owns_embedding, owns_head):
        owns_embedding, owns_head = owns_embedding | single, owns_head | single
        matmuls_s = block_s * layers + np.where(owns_head, head_s, 0.0)
        tp_all_s = (
            tp_layer_s * layers
            + np.where(owns_embedding, tp_embedding_collectives(job) * tp_allreduce_s, 0.0)
            + np.where(owns_head, TP_HEAD_COLLECTIVES * tp_allreduce_s + tp_loss_s, 0.0)
        )
        tp_s = np.where(overlap_tp, np.maximum(tp_all_s - matmuls_s, 0.0), tp_all_s)
        memory_s = bytes_layer * layers / hw.memory_bw_bytes_per_s + np.where(owns_head, loss_s, 0.0)
        ep_s = np.where(overlap_ep, exposed_ep_s(ep_layer_s * layers, matmuls_s, job, accum), ep_layer_s * layers)
        return matmuls_s / (sustained * power), memory_s / sustained, tp_s, cp_ring_s * layers, ep_s

    first, middle, last = layers
    return [stage(first, True, False), stage(middle, False, False), stage(last, False, True)]


def _busiest_stage(totals: list, pp):
    """Which rank (0 first, 1 middle, 2 last) takes longest per micro-batch: it sets the pace of the pipeline.
    Middle ranks exist only with more than two stages; ties go to the last, then the first."""
    return np.where(
        totals[2] >= np.maximum(totals[0], np.where(pp > 2, totals[1], 0)),
        2,
        np.where((pp > 2) & (totals[1] > totals[0]), 1, 0),
    )


def _pipeline_s(job: Job, hw: Hardware, a: Assumptions, totals: list, per_micro_s, accum, micro_tokens):
    """The pipeline's bubble and sends. The busiest rank runs every micro-batch; the others' times fill and drain
    it ((p − 1) stage times for 1F1B and GPipe when the stages are equal; interleaved: 1/v of that). Each
    tensor-parallel rank sends its 1/tp share of the boundary activation (Megatron's scatter-gather)."""
    tp, pp, vpp = (np.asarray(x) for x in (job.parallel.tp, job.parallel.pp, job.parallel.vpp))
    all_ranks_s = totals[0] + np.maximum(pp - 2, 0) * totals[1] + totals[2]
    bubble_s = np.where(pp > 1, (all_ranks_s - per_micro_s) / vpp, 0.0)
    pp_inside = job.cluster.count <= hw.gpus_per_node
    send_bw = _p2p_bw_bytes_per_s(hw, a, pp_inside)
    pp_latency_s = np.where(pp_inside, a.latency_intra_s, a.latency_inter_s)
    block_act = _block_activation_bytes(job, micro_tokens)
    pp_s = np.where(pp > 1, 2 * accum * vpp * (block_act / tp / send_bw + pp_latency_s), 0.0)
    return bubble_s, pp_s


def _overhead_s(job: Job, hw: Hardware, a: Assumptions, layers, accum, owns_head, device_busy_s):
    """Per-op fixed costs of the busiest rank. With a measured kernel profile the host launches asynchronously, so
    its time shows only past what keeps the device busy."""
    overhead_s = fixed_costs_s(job, a, layers, accum, owns_head)
    if hw.kernels is not None:
        host_busy_s = host_s(job, hw.kernels, layers, accum, owns_head)
        overhead_s = np.maximum(host_busy_s - device_busy_s, 0.0)
    return overhead_s


def _optimizer_s(job: Job, hw: Hardware, a: Assumptions, trainable, replicas):
    """The optimizer step: its states' bytes read and written at memory bandwidth (unfused: temporaries re-read),
    or a measured step rate where arithmetic bounds it (a CPU); with offload, on the host plus the PCIe copies
    of gradients and parameters."""
    zero, offload = np.asarray(job.parallel.zero), np.asarray(job.parallel.offload)
    weight_b, grad_b, _o = bytes_per_param(job)
    shard = np.where(zero >= 1, replicas, 1)
    states = model_state_bytes(job)
    impl_factor = 1.0 if optimizer_impl(job) == "fused" else UNFUSED_OPTIMIZER_FACTOR
    device_s = (
        2 * impl_factor * (states.params_bytes + states.grads_bytes + states.optimizer_bytes) / hw.memory_bw_bytes_per_s
    )
    if a.optimizer_params_per_s:
        device_s = np.maximum(device_s, trainable / shard / a.optimizer_params_per_s)
    host_link = hw.host_bw_bytes_per_s * a.host_link_efficiency if hw.host_bw_bytes_per_s else a.pcie_bytes_per_s
    host_s = trainable / shard / a.host_adam_params_per_s + trainable * (grad_b + weight_b) / shard / host_link
    return np.where(offload != "none", host_s, device_s)


def _trainable(job: Job):
    """Parameters one device trains (before ZeRO sharding): its stage on its tp rank, or LoRA's adapters."""
    par = job.parallel
    if job.finetune.adapters:
        return adapter_params_per_layer(job) * (job.model.layers // np.asarray(par.pp)) / np.asarray(par.tp)
    return job_params_per_device(job)
