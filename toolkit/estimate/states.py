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
unsharded copies are transient, modelled with activations). DeepSpeed's ZeRO-1 holds every
gradient until the backward ends, as the paper counts, then reduces them into this rank's
partition before the step (toolkit.estimate.memory). Offload moves the named
states to host memory, reported apart.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.backends import bf16_optimizer, job_deepspeed_fp32
from ..specs.job import TORCH_SEMANTICS, Job
from ..specs.model import ModelSpec
from ..specs.params import count_params, moe_params, projection_shapes, replicated_per_layer, vocab_per_rank
from ..specs.stages import stage_layer_counts
from .moe import dense_block_params, expert_grid, routed_per_device

__all__ = [
    "StateBytes",
    "adapter_params_per_layer",
    "by_stage",
    "job_stage_layers",
    "bytes_per_param",
    "largest_tensor",
    "model_state_bytes",
    "nf4_matrix_bytes",
    "params_per_device",
    "job_params_per_device",
    "experts_on_stage",
    "qlora_block_bytes",
    "replicated_per_layer",
    "vocab_per_rank",
    "ADAM8BIT_BLOCK",
    "ADAM8BIT_BYTES_PER_PARAM",
    "NF4_BLOCK",
    "NF4_SCALE_BLOCK",
]

NF4_BLOCK, NF4_SCALE_BLOCK = 64, 256
"""QLoRA's NF4 (toolkit.program.qlora): weights per absmax, absmax values per fp32 scale (double quantization)."""

ADAM8BIT_BLOCK = 256
"""bitsandbytes' block size for blockwise 8-bit optimizer states (one fp32 absmax per block)."""
ADAM8BIT_BYTES_PER_PARAM = 2 * (1 + 4 / ADAM8BIT_BLOCK)
"""Two int8 states plus their per-block fp32 scales."""


@dataclass(frozen=True)
class StateBytes:
    params_bytes: float | np.ndarray
    grads_bytes: float | np.ndarray
    optimizer_bytes: float | np.ndarray
    host_bytes: float | np.ndarray
    """What offload keeps in host memory, per device (not included in the three above)."""

    @property
    def total_bytes(self) -> float:
        return self.params_bytes + self.grads_bytes + self.optimizer_bytes


MOMENT_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
"""Bytes an Adam moment takes in each dtype Megatron-Core's precision-aware optimizer offers."""


def bytes_per_param(job: Job) -> tuple[float, float, float]:
    """(weights, gradients, optimizer incl. any fp32 master copy) in bytes per parameter, unsharded."""
    plan = job.precision.plan
    weight = plan.weight_bytes
    grad = 4 if plan.master_weights and job.precision.grad_dtype == "fp32" else weight
    state = plan.state_bytes
    name = job.optimizer.name
    if name in ("adam", "adamw"):  # (Megatron's precision-aware optimizer stores the moments narrower)
        moments = job.optimizer.moment_dtype
        optimizer = 2 * (state if moments is None else MOMENT_BYTES[moments])
    elif name == "adamw-8bit":
        optimizer = ADAM8BIT_BYTES_PER_PARAM
    else:  # sgd: one momentum buffer, or none
        optimizer = state if job.optimizer.momentum > 0 else 0
    # DeepSpeed keeps an fp32 copy of each rank's partition, fp32 weights or not (job_deepspeed_fp32)
    master = np.where(plan.master_weights | job_deepspeed_fp32(job), 4, 0)
    return weight, grad, optimizer + master


def zero_partition_params(params, dp, ends=(0.0, 0.0)):
    """Parameters in one rank's DeepSpeed ZeRO-1/2 partition of `params`, counting every tensor its range touches
    whole: a rank inside a large first or last tensor (`ends`: the token embedding's and the head's sizes) holds
    all of it, and the rank where it ends holds it and the rest of its range."""
    span = params / dp
    reach = [np.where(end > span, np.ceil(end / span) * span, span) for end in ends]
    return np.minimum(np.maximum(*reach), params)


def params_per_device(model: ModelSpec, tp=1, pp=1, stage: str | None = None, layers_by_stage=None, ep=1):
    """Parameters held by the busiest pipeline stage on one tensor-parallel rank.

    Stage 0 holds the embeddings, the last stage the final norm and the output projection; `stage`
    ("first", "second", "last") asks for that one instead (a middle stage holds only its blocks).
    (a copy of the embedding when tied and pp > 1, as Megatron keeps). Matrices, column
    biases and the token embedding are divided by tp; norms, row-parallel biases (o, down)
    and learned positions are replicated on every tensor-parallel rank. tp and pp may be
    numpy arrays. `layers_by_stage` = (first, middle, last) rank's layers (toolkit.specs.stages); None = equal.
    A Mixture of Experts' MoE blocks keep 1 / ep of their routed experts, whole on every tensor-parallel rank, as
    are the router and the shared experts; its first dense blocks (DeepSeek) sit on the first stage.
    """
    c = count_params(model)
    tp = np.asarray(tp)
    if not model.has_shape:
        return c.total / (tp * pp)
    replicated = replicated_per_layer(model)
    layer = (c.per_layer - replicated) / tp + replicated
    dense, dense_in_first = layer, 0
    if model.experts:
        mlp, routed, _used = moe_params(model)
        layer = (c.per_layer - mlp - replicated) / tp + replicated + mlp - routed + routed / np.asarray(ep)
        dense = (dense_block_params(model) - replicated) / tp + replicated
        dense_in_first = model.dense_layers
    if layers_by_stage is None:
        layers_by_stage = (model.layers // np.asarray(pp),) * 3
    n_first, n_middle, n_last = layers_by_stage
    rows = vocab_per_rank(model, tp) * model.hidden  # the busiest rank's share of the vocabulary
    embedding = rows + (c.embedding - model.vocab * model.hidden) / tp
    dense_first = np.minimum(dense_in_first, n_first)
    first = embedding + c.positions + layer * (n_first - dense_first) + dense * dense_first
    middle = layer * n_middle
    last = layer * n_last + c.final + rows
    blocks = layer * (model.layers - dense_in_first) + dense * dense_in_first
    total = embedding + c.positions + blocks + c.final + (rows if c.head else 0)
    if stage is None:
        busiest = np.maximum(np.maximum(first, last), np.where(np.asarray(pp) > 2, middle, 0))
    else:
        busiest = by_stage(stage, first, middle, last)
    return np.where(np.asarray(pp) == 1, total, busiest)


def job_params_per_device(job: Job, stage: str | None = None):
    """params_per_device of a resolved job's layout (the busiest stage, or `stage`)."""
    par = job.parallel
    return params_per_device(job.model, par.tp, par.pp, stage, job_stage_layers(job), np.asarray(par.ep) * par.etp)


def experts_on_stage(job: Job, stage: str | None = None):
    """Routed-expert parameters one rank of a stage holds (toolkit.estimate.moe: 1 / (ep · etp) of each MoE block's),
    which ZeRO shards over the experts' data-parallel group rather than over dp; 0 for a dense model."""
    m = job.model
    if not m.has_shape or not m.experts:
        return 0.0
    first, middle, last = job_stage_layers(job)
    pp = np.asarray(job.parallel.pp)
    blocks = by_stage("first" if stage is None else stage, first - np.minimum(m.dense_layers, first), middle, last)
    blocks = np.where(pp == 1, m.moe_layers, blocks)
    return routed_per_device(m, np.asarray(job.parallel.ep) * job.parallel.etp, blocks)


def by_stage(stage, first, second, last):
    """The value for a pipeline stage: `stage` is "first", "second" or "last", or a numpy array of those names
    (toolkit.estimate.memory evaluates all stages in one pass, one per leading index)."""
    if isinstance(stage, str):
        return {"first": first, "second": second, "last": last}[stage]
    return np.select([stage == "first", stage == "second"], [first, second], last)


def largest_tensor(model: ModelSpec, tp=1):
    """Parameters of the largest single tensor on one tensor-parallel rank: an embedding, the head or a matrix."""
    m = model
    matrices = max(m.hidden * m.heads * m.head_dim_, m.hidden * m.ffn_) / np.asarray(tp)
    return np.maximum(vocab_per_rank(m, tp) * m.hidden, matrices)


def adapter_params_per_layer(job: Job) -> int:
    """LoRA parameters of one block: r·(in + out) for every targeted projection (0 for full fine-tuning)."""
    if not job.finetune.adapters:
        return 0
    shapes = projection_shapes(job.model)
    return sum(job.finetune.rank * (shapes[t][0] + shapes[t][1]) for t in job.finetune.targets)


def qlora_block_bytes(job: Job) -> tuple[int, float, int]:
    """Per block: the parameters of its matrices, their bytes as NF4 (codes, 8-bit absmax, fp32 scales, the
    fp32 mean and the 16-entry level table of every NF4Linear), and their bias parameters."""
    m = job.model
    shapes = projection_shapes(m)
    names = [n for n in shapes if n != "gate" or m.mlp == "swiglu"]
    matrices = sum(shapes[n][0] * shapes[n][1] for n in names)
    nf4 = sum(nf4_matrix_bytes(shapes[n][0] * shapes[n][1]) for n in names)
    biased = {"all": names, "qkv": ["q", "k", "v"]}.get(m.bias, [])
    return matrices, nf4, sum(shapes[n][1] for n in biased)


def nf4_matrix_bytes(numel: int) -> float:
    """One NF4Linear's buffers (toolkit.program.qlora): 4-bit codes, an int8 absmax per 64 weights, an fp32
    scale per 256 absmax values, the fp32 mean, and its table of 16 bf16 levels."""
    return numel / 2 + numel / NF4_BLOCK + 4 * numel / (NF4_BLOCK * NF4_SCALE_BLOCK) + 4 + 16 * 2


def model_state_bytes(job: Job, stage: str | None = None) -> StateBytes:
    """Persistent model-state bytes on the busiest device of a resolved job, or of its first or last pipeline
    stage (layout fields may be arrays)."""
    par = job.parallel
    n = job_params_per_device(job, stage)
    weight, grad, optimizer = bytes_per_param(job)
    trainable = n
    if job.finetune.adapters:  # frozen base: only the adapters train
        trainable = adapter_params_per_layer(job) * (job.model.layers // np.asarray(par.pp)) / par.tp
        n = n + trainable
    # context-parallel ranks hold the same weights and reduce gradients with the data-parallel ones: ZeRO shards
    # over both (Megatron's distributed optimizer uses the dp × cp group)
    # (HSDP shards over dp / dp_replicate of them and keeps dp_replicate copies)
    dp = np.maximum(np.asarray(1 if par.dp is None else par.dp) * par.cp // np.asarray(par.dp_replicate), 1)
    zero, offload = np.asarray(par.zero), np.asarray(par.offload)
    ds32 = job_deepspeed_fp32(job)  # DeepSpeed's program in fp32: its ZeRO-2 keeps whole weights
    torch_semantics = (job.precision.mode in TORCH_SEMANTICS) & ~ds32
    shard_weights = np.where((zero == 3) | ((zero == 2) & torch_semantics), dp, 1)
    experts = experts_on_stage(job, stage)  # (sharded over the experts' data-parallel group: moe.expert_grid)
    edp = expert_grid(job).edp

    def sharded(count, shard, experts=experts):
        return (count - experts) / shard + experts / np.where(shard > 1, edp, 1)

    trained_experts = 0.0 if job.finetune.adapters else experts

    params_b = sharded(n, shard_weights) * weight
    if job.finetune.base_16bit(job.precision.mode):  # the frozen block matrices in the autocast dtype, not fp32
        matrices, _nf4, _biases = qlora_block_bytes(job)
        frozen = matrices * (job.model.layers // np.asarray(par.pp)) / par.tp
        params_b = params_b - sharded(frozen, shard_weights, 0.0) * (weight - 2)
    if job.finetune.method == "qlora":  # the blocks' frozen matrices in NF4 instead (LoRA layouts: replicas)
        matrices, nf4, biases = qlora_block_bytes(job)
        stage_layers = job.model.layers // np.asarray(par.pp)
        compute = 2  # NF4Linear keeps its bias in the 16-bit compute dtype
        params_b = params_b + stage_layers * (nf4 - matrices * weight + biases * (compute - weight))
    grads_b = sharded(trainable, np.where(zero >= 2, dp, 1), trained_experts) * grad
    grads_b = grads_b + np.where(bf16_optimizer(job), trainable * 2, 0.0)  # its bf16 gradients beside the fp32
    optimizer_b = sharded(trainable, np.where(zero >= 1, dp, 1), trained_experts) * optimizer
    if np.any(torch_semantics) and not job.finetune.adapters and job.model.has_shape:
        # torch's ZeRO-1 (ZeroRedundancyOptimizer) gives whole tensors to ranks: no rank holds less than the
        # largest one (GPT-2's tied embedding is over half the model)
        optimizer_b = np.where(
            (zero == 1) & torch_semantics,
            np.maximum(optimizer_b, largest_tensor(job.model, par.tp) * optimizer),
            optimizer_b,
        )
    offload_params = offload == "params"
    offload_optimizer = offload_params | (offload == "optimizer")
    host = np.where(offload_optimizer, optimizer_b, 0.0) + np.where(offload_params, params_b + grads_b, 0.0)
    # DeepSpeed's ZeRO-Offload sends the gradients to the host too, into the fp32 partition's gradient. Stages 1
    # and 2 keep a 16-bit copy of the partition there (sent back after the step) and a 16-bit staging buffer the
    # size of the largest tensor, and ZeRO-2 accumulating sums each micro-batch's 16-bit gradients there as well
    # (ZeRO-1 sums them on the device); stage 3 keeps its 16-bit gradient partition there.
    zero_offload = ~torch_semantics & (offload == "optimizer") & (zero >= 1)
    if np.any(zero_offload) and job.model.has_shape:
        accumulating = (np.asarray(1 if job.grad_accum is None else job.grad_accum) > 1) & (zero == 2)
        counts = count_params(job.model)
        whole = np.asarray(par.pp) == 1  # (pipelines: the stage's ends are not modelled here)
        ends = (np.where(whole, counts.embedding, 0) / par.tp, np.where(whole, counts.head, 0) / par.tp)
        summed = np.where(accumulating, weight * zero_partition_params(trainable, dp, ends), 0.0)  # whole tensors
        staging = np.where(zero < 3, weight * largest_tensor(job.model, par.tp), 0.0)
        host = host + np.where(zero_offload, trainable * (4 + weight) / dp + summed + staging, 0.0)
        grads_b = np.where(zero_offload, 0.0, grads_b)
    # rotary cos/sin tables: buffers in the weights' dtype, whole on every rank. A rank's pipeline chunks register
    # the whole model's pair (toolkit.program.parallel): one pair on the CPU, one per chunk once `.to("cuda")` copies
    # each module's buffers
    m = job.model
    pairs = 1 if job.memory.program == "cpu" else np.asarray(par.vpp)
    rope_tables = m.seq_len * m.head_dim_ * weight * pairs if m.has_shape and m.position == "rope" else 0
    # a sigmoid router's balancing bias (DeepSeek-V3's, toolkit.program.moe): an fp32 buffer per expert and MoE block
    if m.has_shape and m.experts and m.router == "sigmoid":
        rope_tables = rope_tables + 4 * m.experts * m.moe_layers
    return StateBytes(
        params_bytes=np.where(offload_params, 0.0, params_b) + rope_tables,
        grads_bytes=np.where(offload_params, 0.0, grads_b),
        optimizer_bytes=np.where(offload_optimizer, 0.0, optimizer_b),
        host_bytes=host,
    )


def job_stage_layers(job: Job):
    """(first, middle, last) pipeline rank's layers of a job (layout fields may be arrays)."""
    par = job.parallel
    if not job.model.has_shape:
        return None
    return stage_layer_counts(job.model.layers, par.pp, par.vpp, par.stage_layers)
