"""The job's parallel layout as functions over a plain GPT (torchtitan's shape), shared by the runner and the tracer.

    mesh = device_mesh(job, "cpu")            # toolkit.program.mesh: ("pp", "dp", "tp"); None in one process
    model = parallelize(model, job, mesh)     # tp/sp first, then ZeRO-2/3 (FSDP2) or DDP over dp

Tensor and sequence parallelism are torch's DTensor plan (toolkit.program.parallel) on the mesh's tp
dimension. ZeRO-2/3 is FSDP2: `fully_shard` on every block and then on the root, each with
`reshard_after_forward` set explicitly (torch's default leaves the root gathered); amp-* gathers 16-bit
parameters and reduces in fp32 (`MixedPrecisionPolicy`) while autocast runs the ops, as the tracer measures;
offload keeps sharded parameters, gradients and optimizer states on the host (`CPUOffloadPolicy`). ZeRO-0
and ZeRO-1 wrap the model in DDP over the dp dimension (ZeRO-1's sharded optimizer is built by
toolkit.program.optim); with tp, whose DTensors DDP refuses, the replicas average gradients by hand. Pipeline
stages are cut by toolkit.program.pipeline; their replicas over dp average gradients by hand too, or are FSDP2
units over dp at ZeRO-2/3.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from ..specs.dims import ParallelDims
from ..specs.job import Job
from .mesh import expert_mesh, fsdp_mesh
from .moe import expert_parallel, moe_modules
from .parallel import tensor_parallel
from .precision import TORCH_DTYPES

__all__ = [
    "parallelize",
    "apply_fsdp",
    "apply_ddp",
    "dp_rank_and_size",
    "is_sharded",
    "needs_grad_all_reduce",
    "reduce_replicas",
    "all_reduce_mean",
]


def dp_rank_and_size(mesh) -> tuple[int, int]:
    """This rank's place among the data-parallel replicas: ranks of one tp group read the same batches."""
    if mesh is None:
        return 0, 1
    return mesh["dp"].get_local_rank(), mesh["dp"].size()


def is_sharded(job: Job) -> bool:
    """Parameters are DTensors (FSDP2, tensor or expert parallelism): their state goes through DCP's state-dict
    API."""
    return ParallelDims.from_job(job).sharded


def parallelize(model: nn.Module, job: Job, mesh, device: torch.device | None = None) -> nn.Module:
    """Apply the job's layout to `model` (built, weights loaded, on its device); returns the module to call."""
    if mesh is None:
        return model
    par = job.parallel
    if par.tp > 1:
        tensor_parallel(model, mesh["tp"], sequence_parallel=par.sp)
    experts = expert_mesh(job, mesh, device.type if device is not None else "cpu")
    if par.ep > 1:
        folded = experts is not mesh  # (ep over tensor-parallel ranks: each routes its share of the sequences)
        expert_parallel(model, experts["ep"], mesh["tp"] if folded else None, experts["edp"])
    if par.zero >= 2:  # pinned host memory needs an accelerator
        pin = device is not None and device.type == "cuda"
        return apply_fsdp(model, job, fsdp_mesh(mesh, job), pin, experts["edp"] if par.ep > 1 else None)
    if ParallelDims.from_job(job).ddp:
        return apply_ddp(model, job, mesh["dp"], device)
    return model  # dp x tp at ZeRO-0/1: the runner calls all_reduce_mean after the last backward


def needs_grad_all_reduce(job: Job, mesh) -> bool:
    """dp x tp (or ep) without FSDP2: DDP (torch 2.13) refuses modules that mix DTensor and plain parameters (its
    start-up broadcast and its gradient hooks), so these replicas average their gradients by hand, once a step."""
    return mesh is not None and ParallelDims.from_job(job).hand_reduce


def reduce_replicas(model: nn.Module, mesh) -> Callable[[list], None]:
    """Averages gradients over the data-parallel replicas by hand (see needs_grad_all_reduce). Under expert
    parallelism a routed expert's gradient is already the mean over its ep ranks (toolkit.program.moe): it is
    averaged over the experts' own data-parallel group, which holds its copies."""
    moes = [moe for moe in moe_modules(model) if moe.ep_size > 1]
    experts = {id(p) for moe in moes for p in moe.experts.parameters()}
    dp_group = mesh["dp"].get_group()
    edp_group = moes[0].edp_group if moes else None
    # folded over tp (Megatron-Core's folding), each tp rank routed its own sequences: the router's and the shared
    # experts' gradients are its share (summed over tp), and an expert's, the mean over ep of every rank's tokens,
    # holds 1 / tp of each replica's: the edp mean times tp is the replicas' mean
    tp = moes[0].tp_size if moes else 1
    partial = (
        {id(p) for moe in moes for n, p in moe.named_parameters() if not n.startswith("experts.")} if tp > 1 else set()
    )

    def reduce(params) -> None:
        if partial:
            all_reduce_mean([p.grad for p in params if id(p) in partial], moes[0].tp_group)
            for p in params:
                if id(p) in partial and p.grad is not None:
                    p.grad.mul_(tp)
        all_reduce_mean([p.grad for p in params if id(p) not in experts], dp_group)
        if experts:
            all_reduce_mean([p.grad for p in params if id(p) in experts], edp_group)
            if tp > 1:
                for p in params:
                    if id(p) in experts and p.grad is not None:
                        p.grad.mul_(tp)

    return reduce


def all_reduce_mean(tensors, group=None, flatten: bool = True) -> None:
    """The mean of each tensor over the ranks of `group` (None: all), in place: gradients where no DDP averages
    them. `flatten`: one all-reduce per dtype over a flat copy, as DDP's buckets do (many small gradients);
    without it one per tensor (fp32 main gradients already live in one buffer: no copy of it). A DTensor
    gradient is reduced through its local shard."""
    import torch.distributed as dist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    size = dist.get_world_size(group)
    locals_ = [t.to_local() if hasattr(t, "to_local") else t for t in tensors if t is not None]
    if not flatten:
        for local in locals_:
            dist.all_reduce(local, group=group)
            local.div_(size)
        return
    by_dtype: dict = {}
    for local in locals_:
        by_dtype.setdefault(local.dtype, []).append(local)
    for grads in by_dtype.values():
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=group)
        flat.div_(size)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(reduced)


def fsdp_policies(job: Job, pin_memory: bool = True):
    """(MixedPrecisionPolicy, OffloadPolicy) of the job under FSDP2."""
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

    plan = job.precision.plan
    precision = MixedPrecisionPolicy()
    if plan.autocast:  # 16-bit gathered weights, fp32 gradient reduction; autocast still runs
        precision = MixedPrecisionPolicy(param_dtype=TORCH_DTYPES[plan.autocast], reduce_dtype=torch.float32)
    placement = CPUOffloadPolicy(pin_memory=pin_memory) if job.parallel.offload != "none" else OffloadPolicy()
    return precision, placement


def apply_fsdp(model: nn.Module, job: Job, dp_mesh, pin_memory: bool = True, edp_mesh=None) -> nn.Module:
    """ZeRO-2 (blocks stay gathered after forward) or ZeRO-3 (resharded), per block and at the root, in place.
    A pipeline stage keeps its blocks gathered from its first forward to its last backward at either stage, as
    torchtitan does (a regather per micro-batch is exposed communication; torch's schedule defers resharding and
    the gradient reduction to the step's last backward anyway), so ZeRO-2 and -3 there are the same program.
    Fake tensors cannot be pinned: the tracer passes pin_memory=False (where host memory is, not how much)."""
    from torch.distributed.fsdp import fully_shard

    precision, placement = fsdp_policies(job, pin_memory)
    reshard = job.parallel.zero == 3 and job.parallel.pp == 1
    kwargs = dict(reshard_after_forward=reshard, mp_policy=precision, offload_policy=placement)
    for moe in moe_modules(model) if job.parallel.ep > 1 else ():
        # the routed experts (DTensors over ep) shard over the experts' own data-parallel group, which averages
        # their gradients (already the mean over ep: toolkit.program.moe)
        fully_shard(moe.experts, mesh=edp_mesh, **kwargs)
    for module in (*model.blocks, model):
        fully_shard(module, mesh=dp_mesh, **kwargs)
    return model


def apply_ddp(model: nn.Module, job: Job, dp_mesh, device: torch.device | None) -> nn.Module:
    """Replicas over the dp dimension; gradients all-reduced in buckets of training.bucket_cap_mb, the gradients
    being views into the buckets (`gradient_as_bucket_view`; otherwise DDP keeps a second, bucketed copy of every
    gradient). The buckets live for the whole run, a gradient-sized buffer through forward as well: the estimate
    models them and the single-process trace reproduces them (toolkit.estimate.memory.ddp_buckets)."""
    from torch.nn.parallel import DistributedDataParallel

    ids = [device.index] if device is not None and device.type == "cuda" else None
    return DistributedDataParallel(
        model,
        device_ids=ids,
        device_mesh=dp_mesh,
        gradient_as_bucket_view=True,
        bucket_cap_mb=job.training.bucket_cap_mb,
        find_unused_parameters=False,
    )
