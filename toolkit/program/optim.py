"""The optimizer the runner builds, and gradient clipping over every parallel layout.

    optimizer = build_optimizer(job, params, zero1_group=None)
    norm = clip_grad_norm(params, max_norm)      # the global norm, whatever the parameters' placements

Two parameter groups: matrices and embeddings decay, vectors (norms, biases) do not. Under torch's ZeRO-1
the optimizer is `ZeroRedundancyOptimizer` over the dp group: each rank steps the states of its share of
whole tensors and broadcasts the updated ones.
"""

from __future__ import annotations

import math

import torch

from ..specs.job import Job

__all__ = ["build_optimizer", "clip_grad_norm", "has_dtensors"]


def build_optimizer(job: Job, params: list[torch.nn.Parameter], zero1_group=None) -> torch.optim.Optimizer:
    """The job's optimizer over `params`; with `zero1_group` (a process group) sharded as ZeRO-1."""
    opt, t = job.optimizer, job.training
    groups = [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": t.weight_decay},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]
    impl = {"for-loop": {"foreach": False}, "foreach": {"foreach": True}, "fused": {"fused": True}}.get(opt.impl, {})
    if opt.name == "adamw-8bit":
        import bitsandbytes as bnb

        return bnb.optim.AdamW8bit(groups, lr=t.lr, betas=(0.9, 0.95))
    if opt.name == "sgd":
        cls, kwargs = torch.optim.SGD, dict(impl, momentum=opt.momentum)
    else:
        cls = torch.optim.AdamW if opt.name == "adamw" else torch.optim.Adam
        kwargs = dict(impl, betas=(0.9, 0.95))
    if zero1_group is not None:
        import warnings

        with warnings.catch_warnings():  # (importing it warns about torch.jit)
            warnings.simplefilter("ignore")
            from torch.distributed.optim import ZeroRedundancyOptimizer
        return ZeroRedundancyOptimizer(groups, optimizer_class=cls, process_group=zero1_group, lr=t.lr, **kwargs)
    return cls(groups, lr=t.lr, **kwargs)


def has_dtensors(params) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in params)


def clip_grad_norm(
    params: list[torch.nn.Parameter], max_norm: float, stage_group=None, counted: list[torch.nn.Parameter] | None = None
):
    """Clip gradients to `max_norm` (inf: only measure) and return the global norm before clipping (a float, or a
    0-d tensor: take float() of it).

    Plain tensors in one pipeline stage go through torch's own clip_grad_norm_ (bit for bit what the replicas
    always did). With DTensors (FSDP2 shards, tensor-parallel slices, mixed with plain replicated tensors) the
    norm of each group of equally placed gradients is taken as a DTensor, which sums the shards' squares over
    the mesh, and the groups' norms are combined here: each element is counted once. Pipeline stages
    (`stage_group`) add their squares over the group; `counted` leaves out copies held twice (a tied
    embedding's head), which are still clipped."""
    if stage_group is None and not has_dtensors(params):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)  # (a 0-d tensor: no wait for its value here)
    grads = [p.grad for p in params if p.grad is not None]
    measured = grads if counted is None else [p.grad for p in counted if p.grad is not None]
    squares = torch.zeros((), dtype=torch.float64)
    for group in _by_placement(measured).values():
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dtype=torch.float32) for g in group]))
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        squares += norm.double().cpu() ** 2
    if stage_group is not None:
        import torch.distributed as dist

        device = grads[0].device if grads else torch.device("cpu")
        squares = squares.to(device)
        dist.all_reduce(squares, group=stage_group)
    if _is_fake(squares):  # the tracer's fake tensors have no value: scaling in place allocates nothing
        return squares.sqrt()
    total = math.sqrt(float(squares))
    coefficient = max_norm / (total + 1e-6)
    if coefficient < 1.0 and math.isfinite(total):
        for grad in grads:
            grad.mul_(coefficient)
    return total


def _is_fake(tensor: torch.Tensor) -> bool:
    """A FakeTensorMode tensor (the tracer's): no value to read."""
    try:
        from torch._subclasses.fake_tensor import FakeTensor
    except ImportError:  # (a torch that moved it: toolkit.program.compat refuses the trace itself)
        return False
    return isinstance(tensor, FakeTensor)


def _by_placement(grads: list[torch.Tensor]) -> dict:
    groups: dict = {}
    for grad in grads:
        key = (grad.device_mesh, tuple(grad.placements)) if hasattr(grad, "placements") else None
        groups.setdefault(key, []).append(grad)
    return groups
