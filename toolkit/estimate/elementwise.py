"""Bytes the element-wise kernels of a training step move: norms, residual adds, activations, rotary embeddings,
dropout, an eager attention core's score kernels, and the loss over the vocabulary. The step-time model prices
them at the device's (achieved) memory bandwidth (toolkit.estimate.steptime)."""

from __future__ import annotations

import numpy as np

from ..specs.job import Job
from .comm import is_megatron
from .mla import attention_view
from .moe import mlp_width
from .states import qlora_block_bytes

__all__ = [
    "memory_bound_bytes_per_token",
    "loss_bytes_per_token",
    "eager_core_bytes_per_score",
    "dequant_bytes_per_block",
]


def memory_bound_bytes_per_token(job: Job, eager):
    """Bytes the element-wise kernels of one block move per token in a step: forward, backward (≈ 2× the
    forward; an eager core's counted kernel by kernel) and what recompute runs again (full and per-op: the
    block's forward; selective: the attention core's).
    Under sequence parallelism the hidden-sized kernels (norms, residual adds, dropout) see s/tp tokens.
    `eager` (a torch program on a GPU whose blocks are not compiled, so no kernel fuses them): RMSNorm runs as
    Llama's composite of casts, pow, mean, rsqrt and two products in fp32, and rotary embeddings as rotate_half's
    slices, negation, concatenation, two products and a sum, each kernel reading and writing whole tensors."""
    m, tp = attention_view(job).model, np.asarray(job.parallel.tp)
    h, q, kv, f = m.hidden, m.heads * m.head_dim_ / tp, m.kv_heads_ * m.head_dim_ / tp, mlp_width(job)
    elem = job.precision.plan.compute_bytes
    residual = job.precision.plan.weight_bytes  # (the residual stream keeps the weights' dtype)
    hidden_share = np.where(np.asarray(job.parallel.sp), 1 / tp, 1.0)
    # fused: read and write the residual stream; composite: x.float() (r, w 4), pow (4, 4), mean (4), x·rsqrt
    # (4, 4), .to(dtype) (4, elem), weight· (elem, elem)
    per_norm = np.where(eager & (m.norm == "rmsnorm"), residual + 28 + 3 * elem, 2 * residual)
    norms = 2 * per_norm * h  # two norms
    adds = 2 * 3 * h * residual  # two residual adds: two reads, one write
    dropout = 2 * 3 * h * elem if m.dropout > 0 else 0  # two hidden dropouts: read, write, mask
    act = (5 if m.mlp == "swiglu" else 2) * f * elem  # silu·mul reads gate and up, writes; GELU reads, writes
    # fused: read, write; rotate_half: x·cos (2), slice and negate (2), cat (2), ·sin (2), sum (3) elements
    rope = np.where(eager, 11, 2) * 2 * (q + kv) * elem / 2 if m.position == "rope" else 0
    casts = 6 * h * elem if job.precision.plan.family == "amp" else 0  # autocast copies of each linear input
    block = (norms + adds + dropout) * hidden_share + act + rope + casts
    core_fwd = core_bwd = 0
    if job.memory.attention == "eager":  # per score element of this rank's heads, per token
        core_fwd, core_bwd = eager_core_bytes_per_score(job) * m.seq_len * m.heads / tp
    recompute = np.asarray(job.memory.recompute)
    # per-op recompute reruns the element-wise kernels too, and an eager core (a fused one saved its output)
    again = np.select(
        [recompute == "full", recompute == "selective", recompute == "selective-op"],
        [block + core_fwd, core_fwd, block + core_fwd],
        0,
    )
    return 3 * block + core_fwd + core_bwd + again


def dequant_bytes_per_block(job: Job):
    """QLoRA: bytes one block's frozen NF4 matrices move per micro-batch being dequantized before each of their
    products (forward, the input's gradient in backward, and a full recompute's forward again), each time reading
    the codes and scales and writing the weight in the compute dtype, as bitsandbytes' dequantize kernel does (the
    product then reads that copy at the matmul's rate). Nothing for other jobs."""
    if job.finetune.method != "qlora":
        return 0.0
    weights, nf4_bytes, _biases = qlora_block_bytes(job)
    uses = 2 + (np.asarray(job.memory.recompute) == "full")
    return uses * (nf4_bytes + weights * job.precision.plan.compute_bytes) / np.asarray(job.parallel.tp)


def loss_bytes_per_token(job: Job):
    """Bytes the loss moves per token over this rank's share of the vocabulary: cross-entropy in fp32 over 16-bit
    logits reads them and writes fp32 log-probabilities, and its backward reads those, writes their fp32
    gradient and casts it back (2·elem + 16 bytes a logit; fp32 logits: 20)."""
    elem = job.precision.plan.compute_bytes
    return job.model.vocab / np.asarray(job.parallel.tp) * (2 * elem + 16)


def eager_core_bytes_per_score(job: Job):
    """(forward, backward) bytes an eager attention core's element-wise kernels move per score element, as
    numpy arrays over a layout grid. torch runs the scaling, the causal mask and the softmax as three kernels,
    each reading and writing the scores (backward: 2, 2 and 3 elements); Megatron fuses them into one (forward
    2, backward 3). Dropout on the probabilities: CUDA's fused kernel writes a byte mask (2 elements and a byte
    each way); torch on CPU draws a float noise tensor, scales it and multiplies (6 elements forward, 3 back).
    Counted op by op on the runner's core: tests/estimate/test_eager_core_bytes.py."""
    elem = job.precision.plan.compute_bytes
    fused = np.asarray(is_megatron(job))
    fwd, bwd = np.where(fused, 2.0, 6.0) * elem, np.where(fused, 3.0, 7.0) * elem
    if job.model.dropout > 0:
        cpu = job.memory.program == "cpu"
        fwd, bwd = fwd + (6 * elem if cpu else 2 * elem + 1), bwd + (3 * elem if cpu else 2 * elem + 1)
    return np.stack([fwd, bwd])
