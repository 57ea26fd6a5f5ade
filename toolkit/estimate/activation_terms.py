"""The saved-tensor terms both activation models build on (toolkit.estimate.activations for every block,
toolkit.estimate.lora_activations under LoRA and QLoRA), and the ActivationBytes both return: dtypes per element,
the widths on one tensor-parallel rank, a norm's and the attention core's saved tensors, the loss's. Kept apart so
that activations can dispatch to the LoRA model and both import these, one way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.backends import is_megatron
from ..specs.job import Job
from .mla import attention_view
from .moe import expert_load, is_moe, mlp_width

__all__ = [
    "INT64_BYTES",
    "INT8_BYTES",
    "INT8_MIN_VALUES",
    "ActivationBytes",
    "attention_core",
    "element_bytes",
    "fsdp_gathers_16bit",
    "loss_bytes",
    "math_path",
    "norm_internal",
    "norm_output",
    "rank_widths",
    "stored_bytes",
]


INT64_BYTES = 8
"""A token id, position or index (int64)."""


@dataclass(frozen=True)
class ActivationBytes:
    """Saved activations of one pipeline stage (the whole model without pipelining)."""

    per_layer: float
    """Saved by one transformer block (its input included) for one micro-batch."""
    layers: float
    """The stage's blocks, times the micro-batches it holds."""
    embedding: float
    """Token ids and positions kept by the embedding lookups, for every micro-batch held (first stage)."""
    head: float
    """Final norm, output projection and loss of one micro-batch (last stage; 0 elsewhere)."""
    recompute_layer: float
    """Under full recompute: one block's activations rebuilt during backward (a transient)."""
    in_flight: float = 1.0
    """Micro-batches the stage holds at once (1 without pipelining)."""
    stage_layers: int = 0
    heads_held: float = 1.0
    """Micro-batches whose head activations are held (GPipe's last stage: all of them)."""
    shared_per_layer: float = 0.0
    """Part of per_layer shared by the micro-batches of a pipeline step: autocast's 16-bit weight casts, cached
    for the whole step (one autocast context around the schedule) and freed only when it ends."""

    @property
    def freed_per_layer(self) -> float:
        """What one micro-batch's backward through one block releases."""
        return self.per_layer - self.shared_per_layer

    shared_head: float = 0.0
    """Part of head shared the same way (the output projection's weight cast)."""
    step_end_buffers: float = 0.0
    """torch's interleaved schedule: the step's receive buffers and every tensor it sent, which it keeps until
    the step ends (0 elsewhere)."""

    @property
    def total(self) -> float:
        return (
            self.layers
            + self.embedding
            + self.head * self.heads_held
            - self.shared_head * np.maximum(self.heads_held - 1, 0)
        )


def rank_widths(job: Job):
    """(h, q, kv, f) on one tensor-parallel rank: attention heads and the MLP are split tp ways (an MoE block's f:
    the width its experts' rows take at the routing's worst case, toolkit.estimate.moe)."""
    m, tp = job.model, job.parallel.tp
    f = mlp_width(job, expert_load(m, job.parallel.ep, for_memory=True)) if is_moe(m) else m.ffn_ // tp
    a = attention_view(job).model  # (latent attention: a standard core that keeps as much)
    return m.hidden, a.heads * a.head_dim_ // tp, a.kv_heads_ * a.head_dim_ // tp, f


def fsdp_gathers_16bit(job: Job):
    """FSDP2 (torch ZeRO-2/3) under amp-*: weights are gathered in 16-bit, so the program runs like pure 16-bit."""
    amp = job.precision.plan.family == "amp"
    return amp & (np.asarray(job.parallel.zero) >= 2)


def element_bytes(job: Job):
    """(bytes per activation element, per residual-stream element, does autocast cast each linear's input?).

    Arrays when the layout is: FSDP2 changes the amp program (see fsdp_gathers_16bit)."""
    family = job.precision.plan.family
    if family == "fp32":
        return 4, 4, np.False_
    if family == "amp":
        fsdp = fsdp_gathers_16bit(job)
        return 2, np.where(fsdp, 2, 4), ~fsdp
    return 2, 2, np.False_


INT8_BYTES = 1 + 4 / 128
"""A value compressed to int8 with one fp32 scale per block of 128 (toolkit.program.techniques.Int8Activations)."""


INT8_MIN_VALUES = 4096
"""Smaller tensors (norm statistics of short batches) are kept as they are."""


def stored_bytes(job: Job, nbytes, block: bool = True, values=None):
    """Bytes per value of a floating-point tensor a block saves: its dtype's, or int8's when the runner compresses
    the blocks' saved tensors (not under full recompute, whose checkpoint keeps the block input itself)."""
    if block and job.memory.act_compress == "int8":
        small = False if values is None else np.asarray(values) < INT8_MIN_VALUES
        return np.where((np.asarray(job.memory.recompute) == "full") | small, nbytes, INT8_BYTES)
    return nbytes


def math_path(job: Job) -> bool:
    """Explicit attention ops: `eager`, or SDPA falling back to its math path (dropout on CPU)."""
    return job.memory.attention == "eager" or (job.model.dropout > 0 and job.memory.program == "cpu")


def norm_output(job: Job, tokens: float, h: int, consumers: int, block: bool = True) -> float:
    """The norm's output as the following linears keep it (autocast: each linear casts it itself)."""
    act, _residual, amp = element_bytes(job)
    return np.where(
        amp,
        consumers * tokens * h * stored_bytes(job, 2, block),
        np.minimum(consumers, 1) * tokens * h * stored_bytes(job, act, block),
    )


def norm_internal(job: Job, tokens: float, h: int, block: bool = True) -> float:
    """What the norm itself keeps for backward: its input (the residual stream) and statistics."""
    _act, residual, _amp = element_bytes(job)
    if job.model.norm == "layernorm":
        stats = np.where(np.equal(residual, 2), 2, 4)
        return tokens * h * stored_bytes(job, residual, block) + 2 * tokens * stored_bytes(
            job, stats, block, values=tokens
        )  # input, mean, rstd
    # torch's RMSNorm computes in fp32: a 16-bit input is kept only as its fp32 copy; x·rstd is kept
    # for the weight's gradient, so not when the weight is frozen (LoRA)
    f32 = stored_bytes(job, 4, block)
    normalized = 0 if job.finetune.adapters else tokens * h * f32
    rstd = tokens * stored_bytes(job, 4, block, values=tokens)
    # Transformer Engine's fused RMSNorm (Megatron-Core) keeps its input as it came and the fp32 rstd
    fused = tokens * h * stored_bytes(job, residual, block) + rstd
    return np.where(is_megatron(job), fused, tokens * h * f32 + normalized + rstd)  # torch: input, x·rstd, rstd


def attention_core(job: Job, tokens: float, b: int) -> float:
    """Bytes the attention core (scores to output) saves: SDPA's or the explicit ops'."""
    act = stored_bytes(job, element_bytes(job)[0])
    m = job.model
    _h, q, kv, _f = rank_widths(job)
    s, a = m.seq_len, m.heads // np.asarray(job.parallel.tp)
    rows = s / job.parallel.cp  # this rank's queries under context parallelism
    scores = b * a * rows * s * act
    dropout = m.dropout > 0
    if not math_path(job):  # flash: q, k, v, out, lse; torch's program repeats k and v to every head first,
        # Transformer Engine hands the kernel its kv groups (Megatron-Core's num_gqa_groups)
        kv_width = np.where(is_megatron(job), kv, q)
        return (2 * q + 2 * kv_width) * tokens * act + b * a * rows * stored_bytes(job, 4, values=b * a * rows)
    if job.memory.attention == "flash":  # SDPA's CPU math fallback computes in fp32
        act = stored_bytes(job, 4)
        scores = b * a * rows * s * act
    core = 3 * tokens * q * act + scores  # q, kᵀ, v as bmm operands; softmax output
    if job.memory.attention == "eager":
        core += rows * s  # causal mask (bool)
    if dropout:
        mask = scores if job.memory.program == "cpu" else b * a * rows * s
        core += mask + scores  # dropout mask and dropped probabilities
    return core


def loss_bytes(job: Job, tokens: float, vocab: float) -> float:
    """Output projection and loss: fp32 log-softmax, target ids, the loss and nll's total weight, the step's running
    loss sum (an fp32 scalar, toolkit.program.step), and the projection's 16-bit weight cast under autocast."""
    amp = element_bytes(job)[2]
    return tokens * vocab * 4 + tokens * INT64_BYTES + 3 * 4 + amp * 2 * job.model.hidden * vocab
