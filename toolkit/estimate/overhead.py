"""The fixed costs of a step's operations: what each tensor operation costs the host beyond its kernel (dispatch,
autograd, launch), counted in op units, and each checkpointed region's own cost. On a CPU they are measured by
toolkit calibrate and add to the step; on a GPU the host launches asynchronously and shows only where its time
exceeds the device's (toolkit.estimate.steptime)."""

from __future__ import annotations

import numpy as np

from ..specs.job import Job
from .phases import optimizer_impl

__all__ = ["op_units", "optimizer_ops", "fixed_costs_s", "host_s", "HOST_OPS_PER_UNIT"]


def op_units(job: Job, layers, owns_head):
    """Operations of one micro-batch, in op units (a forward op one, its backward two): each block's forward ops
    (two norms, q, k, v, o, the attention core, two residual adds, the MLP's two or three linears and its
    activation, dropouts, rotary embeddings) three times, once more under full recompute (less the saved ones
    under per-op recompute); the embedding, the head and the loss. Each unit stands for the several tensor
    operations torch runs for it (a linear: a transpose and a product; its backward: two products, a sum, a
    gradient added in), which is why toolkit calibrate prices a unit from the job's own model. A fused attention
    core is one op; an eager one five (the score product, its scaling, the causal mask, the softmax and the
    product with v), and a sixth where dropout falls on its probabilities."""
    m = job.model
    core_ops = 1 if job.memory.attention != "eager" else 5 + (m.dropout > 0)
    block_ops = (
        13
        + core_ops
        + (2 if m.mlp == "swiglu" else 0)
        + (2 if m.dropout > 0 else 0)
        + (8 if m.position == "rope" else 0)
    )
    recompute = np.asarray(job.memory.recompute)
    # per-op recompute takes its policy's saved ops (every other matmul, the fused attention) from its cache
    again = np.select([recompute == "full", recompute == "selective-op"], [block_ops, block_ops - 4], 0)
    return layers * (3 * block_ops + again) + 3 * 3 + np.where(owns_head, 3 * 4, 0)


def fixed_costs_s(job: Job, a, layers, accum, owns_head):
    """Fixed costs of the step's operations on the busiest rank: every micro-batch's op units (`op_units`); once
    a step, the optimizer's ops on each tensor (torch's for-loop AdamW: about eight per tensor; foreach and fused:
    a few per step, counted as tensor operations); and each checkpointed region's own cost under recompute (per-op
    recompute's dispatch mode on top)."""
    recompute = np.asarray(job.memory.recompute)
    optimizer_units = optimizer_ops(job, layers)
    regions = layers * (recompute != "none")  # one checkpointed region per block (its core: selective)
    return (
        accum * op_units(job, layers, owns_head) * a.ops_per_unit + optimizer_units
    ) * a.op_overhead_s + accum * regions * (
        a.checkpoint_overhead_s + (recompute == "selective-op") * a.selective_op_overhead_s
    )


HOST_OPS_PER_UNIT = 3.0
"""Tensor operations one op unit stands for in a torch program: toolkit calibrate counts about 3 in the runner's
GPT (a linear's forward is a transpose and a product; its backward two products, a sum and an add)."""


def host_s(job: Job, prof, layers, accum, owns_head):
    """The host's time to issue a step's operations (kernels.yaml's host_op_s each): a small model's kernels can
    finish before the host has launched the next, and then the host sets the pace."""
    return (accum * op_units(job, layers, owns_head) * HOST_OPS_PER_UNIT + optimizer_ops(job, layers)) * prof.host_op_s


def optimizer_ops(job: Job, layers):
    """Tensor operations of one optimizer step: torch's for-loop AdamW about eight per parameter tensor (a block's
    eight or ten, plus the embeddings, the final norm and the head); foreach and fused a few per step."""
    tensors = layers * (10 if job.model.bias == "all" else 8) + 4
    return np.where(optimizer_impl(job) == "for-loop", 8 * tensors, 24)
