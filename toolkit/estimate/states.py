"""Model-state memory per device: parameters, gradients and optimizer states.

Bytes per parameter follow the precision mode's semantics (see toolkit.specs.job):

| mode          | weights | grads            | optimizer (Adam)            |
|---------------|---------|------------------|-----------------------------|
| fp32, amp-*   | 4       | 4                | 8 (m, v in fp32)            |
| mixed-*       | 2       | 2 (4 with fp32 main grads) | 12 (fp32 master, m, v) |
| pure-bf16     | 2       | 2                | 4 (m, v in bf16)            |

ZeRO shards over the dp ranks: stage 1 the optimizer part, stage 2 also the gradients,
stage 3 also the weights (ZeRO paper, arXiv 1910.02054). Under torch semantics ZeRO-2 is
FSDP2 without resharding after forward: its persistent weights are sharded too (the
unsharded copies are transient, modelled with activations). Offload moves the named
states to host memory, reported apart.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..specs.job import TORCH_SEMANTICS, Job
from ..specs.model import ModelSpec
from .params import count_params

__all__ = ["StateBytes", "bytes_per_param", "params_per_device", "model_state_bytes",
           "ADAM8BIT_BLOCK", "ADAM8BIT_BYTES_PER_PARAM"]

ADAM8BIT_BLOCK = 256
"""bitsandbytes' block size for blockwise 8-bit optimizer states (one fp32 absmax per block)."""
ADAM8BIT_BYTES_PER_PARAM = 2 * (1 + 4 / ADAM8BIT_BLOCK)
"""Two int8 states plus their per-block fp32 scales."""


@dataclass(frozen=True)
class StateBytes:
    params_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    host_bytes: float
    """What offload keeps in host memory, per device (not included in the three above)."""

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


def bytes_per_param(job: Job) -> tuple[float, float, float]:
    """(weights, gradients, optimizer incl. any fp32 master copy) in bytes per parameter, unsharded."""
    mode = job.precision.mode
    weight = 2 if mode.startswith(("mixed-", "pure-")) else 4
    grad = 4 if mode.startswith("mixed-") and job.precision.grad_dtype == "fp32" else weight
    state = 2 if mode == "pure-bf16" else 4
    name = job.optimizer.name
    if name in ("adam", "adamw"):
        optimizer = 2 * state
    elif name == "adamw-8bit":
        optimizer = ADAM8BIT_BYTES_PER_PARAM
    else:  # sgd: one momentum buffer, or none
        optimizer = state if job.optimizer.momentum > 0 else 0
    master = 4 if mode.startswith("mixed-") else 0
    return weight, grad, optimizer + master


def params_per_device(model: ModelSpec, tp: int = 1, pp: int = 1) -> float:
    """Parameters held by the busiest pipeline stage on one tensor-parallel rank.

    Stage 0 holds the embeddings, the last stage the final norm and the output projection
    (a copy of the embedding when tied and pp > 1, as Megatron keeps). Everything is divided
    by tp; replicated norms make this low by under 0.1 %.
    """
    c = count_params(model)
    if not model.has_shape:
        return c.total / (tp * pp)
    stage_layers = c.per_layer * (model.layers // pp)
    if pp == 1:
        return c.total / tp
    first = c.embedding + c.positions + stage_layers
    head = c.head if c.head else c.embedding
    last = stage_layers + c.final + head
    return max(first, last) / tp


def model_state_bytes(job: Job) -> StateBytes:
    """Persistent model-state bytes on the busiest device of a resolved job."""
    par = job.parallel
    n = params_per_device(job.model, par.tp, par.pp)
    weight, grad, optimizer = bytes_per_param(job)
    dp = par.dp or 1
    torch_semantics = job.precision.mode in TORCH_SEMANTICS
    shard_weights = dp if par.zero == 3 or (par.zero == 2 and torch_semantics) else 1
    shard_grads = dp if par.zero >= 2 else 1
    shard_optimizer = dp if par.zero >= 1 else 1
    params_b = n * weight / shard_weights
    grads_b = n * grad / shard_grads
    optimizer_b = n * optimizer / shard_optimizer
    host = 0.0
    if par.offload in ("optimizer", "params"):
        host += optimizer_b
        optimizer_b = 0.0
    if par.offload == "params":
        host += params_b + grads_b
        params_b = grads_b = 0.0
    return StateBytes(params_bytes=params_b, grads_bytes=grads_b, optimizer_bytes=optimizer_b, host_bytes=host)
