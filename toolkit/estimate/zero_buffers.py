"""The transient buffers of sharded data parallelism, in bytes per device: FSDP2's gathered parameters and
reduce-scatter input (torch semantics), DeepSpeed's reduce bucket, its flattened copy and the gradient partition
(mixed-* semantics). toolkit.estimate.memory places them in the phases of a step; each is checked against FSDP2
on a fake process group and DeepSpeed on gloo ranks (toolkit.trace)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..specs.backends import bf16_optimizer, job_deepspeed_fp32
from ..specs.job import TORCH_SEMANTICS, Job
from .params import linear_params_per_layer
from .states import zero_partition_params

__all__ = ["Gathered", "Reduce", "deepspeed_reduce", "gathered_block_bytes", "gathered_params", "largest_matrix"]


@dataclass(frozen=True)
class Gathered:
    """Unsharded parameters alive outside the optimizer step, in bytes (see gathered_params)."""

    blocks: float = 0.0  # every block, gathered from its forward to its backward (ZeRO-2)
    root: float = 0.0  # embeddings, head and final norm, gathered all forward and backward
    at_loss: float = 0.0  # blocks gathered when backward starts (ZeRO-3: the prefetched last one)
    in_backward: float = 0.0  # blocks gathered during a block's backward (ZeRO-3: it and the next)
    reduce_scatter: float = 0.0  # one block's unsharded gradients in the reduce-scatter input
    block: float = 0.0  # one gathered block
    prefetch: float = 0.0  # of in_backward, the next block's prefetch (none below the bottom block)
    forward_tail: float = 0.0  # ZeRO-2: the last block's all-gather output, kept until backward starts


def pipelined_fsdp(job: Job):
    """FSDP2 under torch's pipeline schedules (torchtitan's program; toolkit.program.build): each stage's blocks
    stay gathered from its first forward to its last backward, gradients stay whole, accumulating in the reduce
    dtype (fp32 under amp-*), and are reduce-scattered after the step's last backward. ZeRO-2 and -3 alike."""
    torch_semantics = (job.precision.mode in TORCH_SEMANTICS) & ~job_deepspeed_fp32(job)
    return torch_semantics & (np.asarray(job.parallel.zero) >= 2) & (np.asarray(job.parallel.pp) > 1)


def accumulated_grad_bytes(job: Job):
    """Bytes per element of a gradient FSDP2 accumulates whole (no-sync): the reduce dtype's."""
    return 4 if job.precision.plan.family in ("fp32", "amp") else job.precision.plan.weight_bytes


def gathered_block_bytes(job: Job, counts) -> float:
    """One whole block as FSDP2 gathers it: in the compute dtype, its linear weights in float8 (1 byte) with
    `precision.fp8_all_gather` (torchao casts each shard to float8 before the all-gather and the matmuls use it)."""
    compute_bytes = job.precision.plan.compute_bytes
    if not job.precision.fp8_all_gather:
        return counts.per_layer * compute_bytes
    linear = linear_params_per_layer(job.model)
    return linear * 1 + (counts.per_layer - linear) * compute_bytes


def gathered_params(job: Job, counts, stage_layers, owns_embedding, owns_head) -> Gathered:
    """FSDP2 (torch semantics) gathers the root's parameters for the whole forward and backward: a stage's own
    (the embedding on the first, the final norm and the head on the last; a tied head is its own copy there).
    Without resharding after forward (ZeRO-2, with or without offload) every block's 16-bit weights
    stay gathered from its forward to its backward; with resharding (ZeRO-3) one block is gathered
    and the next prefetched. Each block's gradients wait in the reduce-scatter input (fp32 under
    amp-*) while the block below runs its backward. DeepSpeed's ZeRO-3, configured to prefetch one
    block's parameters and release them after use (toolkit.trace.zero), holds two blocks' worth.
    Checked against FSDP2 traces on a fake process group and DeepSpeed on gloo ranks.
    """
    par, mode = job.parallel, job.precision.mode
    zero = np.asarray(par.zero)
    compute_bytes = job.precision.plan.compute_bytes
    block = gathered_block_bytes(job, counts) / np.asarray(par.tp)
    head_copy = counts.head if counts.head else np.where(owns_embedding, 0, counts.embedding)  # (tied: a copy)
    root = (
        (
            np.where(owns_embedding, counts.embedding + counts.positions, 0)
            + np.where(owns_head, head_copy + counts.final, 0)
        )
        / np.asarray(par.tp)
        * compute_bytes
    )
    reduce_scatter = counts.per_layer / np.asarray(par.tp) * job.precision.plan.weight_bytes  # (the grads' dtype)
    torch_semantics = (mode in TORCH_SEMANTICS) & ~job_deepspeed_fp32(job)  # (DeepSpeed's fp32: not FSDP2)
    piped = pipelined_fsdp(job)
    zero2 = torch_semantics & ((zero == 2) | piped)  # every block stays gathered
    zero3 = torch_semantics & (zero == 3) & ~piped
    deepspeed3 = ~torch_semantics & (zero == 3)
    head = (counts.head or counts.embedding) / np.asarray(par.tp) * compute_bytes  # (tied: the embedding)
    fsdp = zero2 | zero3
    # over one rank FSDP2 gathers nothing: each module's unsharded parameters are made from its shard as it runs
    # (torch's FSDPParamGroup.unshard returns early, wait_for_unshard copies): no block prefetched ahead of its
    # use, no all-gather output held past it
    gathers = np.asarray(par.dp) // np.asarray(par.dp_replicate) > 1  # (HSDP gathers within a shard group)
    # expert parallelism: a block's routed experts are their own FSDP2 unit (over the experts' data-parallel
    # group), so what is prefetched while a block's experts run backward is the block's other part
    experts = counts.experts_per_layer * compute_bytes * (np.asarray(par.ep) > 1)
    prefetched = block - experts
    expert_gathers = np.asarray(par.dp) // np.asarray(par.ep) > 1
    return Gathered(
        blocks=np.where(zero2, block * stage_layers, 0.0),
        root=np.where(fsdp, root, 0.0),
        # DeepSpeed's ZeRO-3 keeps up to two blocks' worth of parameters live: the head, gathered for its backward,
        # and as much of the top block as fits beside it (none beside a head larger than that)
        at_loss=np.select([zero3 & gathers, deepspeed3], [block, np.maximum(head, 2 * block)], 0.0),
        in_backward=np.where(
            zero3 | deepspeed3, block + np.where(zero3 & ~gathers, 0.0, prefetched), 0.0
        ),  # (ZeRO-2's:
        reduce_scatter=np.where(fsdp & ~piped, reduce_scatter, 0.0),  # in `blocks`; pipelines: reduce-scattered
        block=block,  # after the last backward)
        prefetch=np.where(zero3 & gathers, prefetched, 0.0),
        # the top block's last unit's all-gather output, still held at the end of forward (under expert parallelism
        # its experts', where their group has more than one rank)
        forward_tail=np.where(zero2 & ~piped & gathers, np.where(experts > 0, experts * expert_gathers, block), 0.0),
    )


@dataclass(frozen=True)
class Reduce:
    """DeepSpeed's gradient buffers (mixed-* with ZeRO), in bytes; all 0 elsewhere.

    ZeRO-2 copies each gradient into a contiguous bucket (training.bucket_cap_mb) as backward makes
    it; a full bucket is flattened once more for the all-reduce, and this rank's slice copied into
    its 16-bit gradient partition, made whole at the first reduction. ZeRO-1 does the same once the
    last micro-batch's backward is over, holding every gradient until then. ZeRO-3 makes its bucket
    and partition at start-up. With ZeRO-Offload the partitions live on the host (states.py), and
    stages 1 and 2 keep a staging buffer the size of the largest tensor on the device. Checked against DeepSpeed 0.19 on gloo ranks (toolkit.trace.zero)."""

    bucket: float = 0.0  # the reduce bucket, from the first gradient of a backward to its end
    fixed: float = 0.0  # ZeRO-3: its gradient partition and reduce bucket, made at start-up
    flat_copy: float = 0.0  # a bucket's contents, flattened for the reduction
    partition: float = 0.0  # this rank's gradient partition, from the first reduction to the step
    grads: float = 0.0  # every 16-bit gradient of the stage, whole
    stage1: bool | np.ndarray = False
    staging: float = 0.0  # ZeRO-Offload: a buffer the size of the largest tensor, kept on the device

    def flushed(self, made: float):
        """1 where a bucket has already been reduced once `made` bytes of gradients exist."""
        return np.asarray(made) > self.bucket


def deepspeed_reduce(job: Job, params: float, grad_b: float, dp, ends=(0.0, 0.0)) -> Reduce:
    """`params`: the stage's trainable parameters on this rank, `ends`: its first and last tensors (the token
    embedding and the head, whose size decides how far past its range a ZeRO-1/2 partition reaches)."""
    par, zero = job.parallel, np.asarray(job.parallel.zero)
    ds32 = job_deepspeed_fp32(job)
    if (job.precision.mode in TORCH_SEMANTICS and not np.any(ds32)) or not np.any(zero > 0):
        return Reduce()
    weight_b = job.precision.plan.weight_bytes  # DeepSpeed's buckets are in the weights' dtype
    grads_bytes = params * grad_b
    # ZeRO-1/2's gradient partition holds every parameter its range touches, whole (ZeRO-3 splits each parameter)
    partition_bytes = np.where(zero == 3, params / dp, zero_partition_params(params, dp, ends)) * grad_b
    # ZeRO-Offload copies each reduced slice to the host: no partition on the device (ZeRO-2 holds nothing there
    # between micro-batches; ZeRO-1 still keeps whole gradients until the last one)
    offload = np.asarray(par.offload) == "optimizer"
    bf16_opt = bf16_optimizer(job)  # (it reduces its fp32 buffer at the step: no bucket, no 16-bit partition)
    partition_bytes = np.where(bf16_opt, 0.0, partition_bytes)
    program = (job.precision.mode not in TORCH_SEMANTICS) | ds32  # the layouts DeepSpeed's engine runs
    on = ((zero == 1) | (zero == 2)) & ~bf16_opt & program
    partition_bytes = np.where(offload & on, 0.0, partition_bytes)
    staging = np.where(
        offload & on, weight_b * np.maximum(np.maximum(*ends), largest_matrix(job) / np.asarray(par.tp)), 0.0
    )
    bucket_bytes = int(job.training.bucket_cap_mb * 2**20 / weight_b) * weight_b  # as deepspeed_config sets it
    bucket = np.where(on, bucket_bytes, 0.0)
    # (ZeRO-3 with ZeRO-Offload: its gradient partition is on the host, its bucket still on the device)
    fixed = np.select(
        [(zero == 3) & (np.asarray(par.offload) == "none") & program, (zero == 3) & offload & program],
        [partition_bytes + bucket_bytes, bucket_bytes],
        0.0,
    )
    partition_bytes = np.where(program, partition_bytes, 0.0)
    return Reduce(
        bucket=bucket,
        fixed=fixed,
        flat_copy=np.minimum(bucket, grads_bytes),
        partition=partition_bytes,
        grads=np.where(on, grads_bytes, 0.0),
        stage1=on & (zero == 1),
        staging=staging,
    )


def largest_matrix(job: Job) -> int:
    """Elements of a block's largest matrix (an attention projection or an MLP matrix), before tp."""
    m = job.model
    largest = max(m.hidden * m.heads * m.head_dim_, m.hidden * m.ffn_)
    if m.has_shape and m.experts:  # the runner keeps a block's experts in one (experts / ep, h, f) tensor each
        largest = np.maximum(
            largest, m.experts / (np.asarray(job.parallel.ep) * job.parallel.etp) * m.hidden * m.expert_ffn_
        )
    return largest
