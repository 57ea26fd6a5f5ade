"""One serving device's memory: the weights as stored (16-bit, fp8, int8, int4 with its group scales, 2:4 sparse), the
activations of one engine step, what the device holds beyond the tensors, and the KV cache the rest holds, counted
in blocks as a paged engine (vLLM) counts them.

    mem = serving_memory(job, accelerator)      # a resolved `workload: inference` job
    mem.max_concurrency                          # requests at max_context the cache holds

vLLM sizes its cache so: of each device's memory it may use gpu_memory_utilization (serving.memory_fraction); it runs
one step at max_num_batched_tokens to see the activations' peak, subtracts that, the weights and what lies outside
torch's allocator (CUDA context, NCCL), and fills the rest with KV blocks (vLLM docs, "Engine arguments";
vllm/v1/worker/gpu_worker.py determine_available_memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..specs.catalog import Accelerator
from ..specs.job import Job
from ..specs.params import count_params, replicated_per_layer
from ..specs.serving import KV_BYTES, WEIGHT_BITS
from .device import assumptions_for
from .kv_cache import cache_bytes, kv_bytes_per_token
from .moe import activation_width

__all__ = [
    "ServingMemory",
    "serving_memory",
    "matrix_bits",
    "weight_bytes",
    "step_activation_bytes",
    "runner_peak_bytes",
]

INT4_ZERO_BITS = 4
"""GPTQ and AWQ keep a 4-bit zero point beside each group's 16-bit scale (AutoGPTQ's and AutoAWQ's packed qzeros)."""
SPARSE_INDEX_BITS = 2
"""2:4 sparsity stores the kept half of the weights and a 2-bit index for each (NVIDIA A100 Tensor Core GPU
Architecture whitepaper, 'Fine-Grained Structured Sparsity': compressed values plus 2-bit metadata)."""


FP4_SCALE_BITS = {"fp4": 8 / 32, "mxfp4": 8 / 32, "nvfp4": 8 / 16}
"""Scale bits a 4-bit float weight carries: MXFP4 an 8-bit power-of-two scale per 32 (OCP Microscaling Formats
v1.0), NVFP4 an FP8 (E4M3) scale per 16 (NVIDIA's NVFP4 blog, 2025; its one fp32 scale per tensor is left out)."""


def matrix_bits(job: Job) -> float:
    """Bits one weight of the blocks' matrices takes in memory, scales and sparse indices included."""
    s = job.serving
    bits = WEIGHT_BITS[s.weights]
    if s.weights == "int4" and s.group_size:
        bits += (16 + INT4_ZERO_BITS) / s.group_size
    bits += FP4_SCALE_BITS.get(s.weights, 0.0)
    if s.sparsity == "2:4":
        bits = 0.5 * (bits + SPARSE_INDEX_BITS)
    return bits


def weight_bytes(job: Job) -> tuple[float, float]:
    """(the blocks' matrices, everything else) in bytes on the busiest device. The matrices split over tp and pp;
    what tp does not split stays whole on every rank: the norms and the biases after the row-parallel o and down
    (toolkit.specs.params.replicated_per_layer), and a learned position table (vLLM's GPT-2 and the runner alike);
    the token embedding and the head split by vocabulary (vLLM's VocabParallelEmbedding), one on each end stage.
    With expert parallelism each device holds experts / ep whole routed experts instead of a tp slice of all."""
    m, par = job.model, job.parallel
    pc = count_params(m)
    whole = replicated_per_layer(m) * m.layers
    routed = pc.experts_per_layer * (m.layers - m.dense_layers) if par.ep > 1 else 0  # split by ep, not tp
    matrices = ((pc.layers - whole - routed) / par.tp + routed / par.ep) * math.ceil(m.layers / par.pp) / m.layers
    vocab = pc.embedding + pc.head if par.pp == 1 else max(pc.embedding, pc.head or pc.embedding)
    other = vocab / par.tp + pc.positions + whole / par.pp + pc.final
    return matrices * matrix_bits(job) / 8, other * job.precision.plan.compute_bytes


def runner_peak_bytes(job: Job, step_tokens: int) -> float:
    """The peak of toolkit.program.generate on one rank (what MemTracker measures on a CPU): the weights in the
    compute dtype, the whole static cache, and one step's activations over `step_tokens` tokens with the last
    positions' logits (this rank's vocabulary columns and, under tp, the gathered whole)."""
    s, par, cb = job.serving, job.parallel, job.precision.plan.compute_bytes
    matrices, other = weight_bytes(job)
    cache = s.concurrency * cache_bytes(job.model, s.context, KV_BYTES[s.kv_dtype], par.tp)
    logits = s.concurrency * job.model.vocab * cb * (1 + (1 / par.tp if par.tp > 1 else 0))
    return matrices + other + cache + _widest(job) * step_tokens * cb + logits


def _widest(job: Job) -> float:
    """Numbers per token alive at a block's widest point: the residual stream and its normed copy beside the MLP's
    gate and up outputs and their product (a Mixture of Experts' routed rows), or the attention's q, k, v and its
    output with that output's contiguous copy."""
    m, par = job.model, job.parallel
    mlp = activation_width(m) * (3 if m.mlp == "swiglu" else 2) / par.tp
    attention = (m.heads * 3 + 2 * m.kv_heads_) * m.head_dim_ / par.tp
    return 2 * m.hidden + max(mlp, attention)


def step_activation_bytes(job: Job, rows: int) -> float:
    """The largest tensors alive in one engine step of serving.max_batched_tokens tokens (no autograd: each block's
    inputs die as it ends): the residual stream and its normed copy beside the widest intermediate of a block (the
    MLP's gate and up outputs and their product, a Mixture of Experts' routed rows, or the attention's q, k, v and
    output); and the logits of the `rows` sequences that sample, with the sampler's fp32 copy and probabilities."""
    m, cb = job.model, job.precision.plan.compute_bytes
    tokens = job.serving.max_batched_tokens
    widest = _widest(job)
    logits = min(rows, tokens) * m.vocab * (cb + 4 + 4)
    return tokens * widest * cb + logits


@dataclass(frozen=True)
class ServingMemory:
    capacity_bytes: float
    budget_bytes: float
    """capacity × memory_fraction: what the engine may use."""
    weights_bytes: float
    activation_bytes: float
    runtime_bytes: float
    """CUDA context, cuBLAS workspaces and NCCL's buffers (toolkit.estimate.device's terms)."""
    kv_pool_bytes: float
    """What is left for the KV cache, whole blocks."""
    kv_blocks: int
    kv_bytes_per_token: float
    sequence_kv_bytes: float
    """One request at max_context, in whole blocks."""
    max_concurrency: int
    concurrency: int
    kv_cache_bytes: float
    """What `concurrency` requests at max_context hold."""

    @property
    def fits(self) -> bool:
        return self.kv_blocks > 0 and self.concurrency <= self.max_concurrency

    @property
    def device_bytes(self) -> float:
        """The device's use with the requests' cache (not the whole pool the engine reserves)."""
        return self.weights_bytes + self.activation_bytes + self.runtime_bytes + self.kv_cache_bytes


def _runtime_bytes(job: Job, accelerator: Accelerator) -> float:
    a = assumptions_for(accelerator)
    groups = (job.parallel.tp > 1) + (job.parallel.pp > 1) + (job.parallel.ep > 1)
    peers = 0 if job.parallel.pp == 1 else 2
    return a.context_bytes + a.workspace_bytes + groups * a.comm_group_bytes + peers * a.p2p_peer_bytes


def _sequence_bytes(job: Job, kv_bytes: float) -> float:
    """One request at max_context in whole blocks; a sliding-window layer keeps its window and one block more."""
    s, par = job.serving, job.parallel
    return cache_bytes(job.model, s.context, kv_bytes, par.tp, par.pp, s.block_size)


def serving_memory(job: Job, accelerator: Accelerator) -> ServingMemory:
    """The busiest device's memory for a resolved serving job, and the concurrency its KV cache allows."""
    s, par = job.serving, job.parallel
    kv_bytes = KV_BYTES[s.kv_dtype]
    matrices, other = weight_bytes(job)
    weights = matrices + other
    per_token = kv_bytes_per_token(job.model, kv_bytes, par.tp, par.pp)
    seq = _sequence_bytes(job, kv_bytes)
    capacity = float(accelerator.memory_bytes)
    budget = capacity * s.memory_fraction
    rows = 1 if s.concurrency == "max" else s.concurrency
    runtime = _runtime_bytes(job, accelerator)
    left = budget - weights - runtime
    block_bytes = per_token * s.block_size

    def fill(rows: int) -> tuple[float, int, int]:
        """(a step's activations sampling `rows` sequences, the KV blocks left beside them, the requests they hold)"""
        acts = step_activation_bytes(job, rows)
        blocks = max(int((left - acts) // block_bytes), 0) if block_bytes else 0
        return acts, blocks, int(blocks * block_bytes // seq) if seq else 0

    acts, blocks, max_conc = fill(rows)
    if s.concurrency == "max":  # as many as fit, then the step that samples them all
        acts, blocks, max_conc = fill(max(max_conc, 1))
    concurrency = max(max_conc, 1) if s.concurrency == "max" else s.concurrency
    return ServingMemory(
        capacity_bytes=capacity,
        budget_bytes=budget,
        weights_bytes=weights,
        activation_bytes=acts,
        runtime_bytes=runtime,
        kv_pool_bytes=blocks * block_bytes,
        kv_blocks=blocks,
        kv_bytes_per_token=per_token,
        sequence_kv_bytes=seq,
        max_concurrency=max_conc,
        concurrency=concurrency,
        kv_cache_bytes=concurrency * seq,
    )
