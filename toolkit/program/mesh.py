"""The one device mesh builder: the runner, the tracer's fake process group, generate and calibrate all build their
mesh here from a ParallelDims (toolkit.specs.dims), so a rank's groups are the same wherever the program runs.

    mesh = device_mesh(job, "cpu")             # the job's mesh over the world; None when one process needs none
    mesh = build_mesh(ParallelDims(dp=4, tp=2), "cpu")
"""

from __future__ import annotations

import warnings

from ..specs.dims import ParallelDims
from ..specs.job import Job

__all__ = [
    "build_mesh",
    "device_mesh",
    "expert_mesh",
    "fsdp_mesh",
    "join_one_process_group",
    "leave_one_process_group",
]


def build_mesh(dims: ParallelDims, device_type: str):
    """The (pp, dp, cp, tp) mesh of `dims` over the running process group, outermost first (rank = (pp_rank · dp +
    dp_rank) · tp + tp_rank: a tensor-parallel group is neighbouring ranks, one node; pipeline stages far apart),
    with dp split into HSDP's copies and shards or the experts' groups and flattened back as "dp"."""
    from torch.distributed.device_mesh import init_device_mesh

    # "dp" over a split dp is a flattened dimension that the runner slices by name; torch warns that it will want
    # it kept apart instead (a future torch's change, not this run's problem)
    warnings.filterwarnings("ignore", message="Slicing a flattened dim", category=UserWarning)
    names, sizes, flattened = dims.mesh_shape()
    mesh = init_device_mesh(device_type, sizes, mesh_dim_names=names)
    for name, parts in flattened.items():
        mesh[parts]._flatten(name)
    return mesh


def expert_mesh(job: Job, mesh, device_type: str):
    """The mesh the routed experts live on: the job's own mesh where ep sits inside dp ("ep", "edp" dimensions),
    else, folded as Megatron-Core folds them, a mesh of their own over the same ranks ("pp", "edp", "ep", "etp":
    ParallelDims.expert_mesh_shape). Every rank must call it (it makes process groups); None without ep."""
    dims = ParallelDims.from_job(job)
    if mesh is None or dims.ep * dims.etp == 1:
        return None
    if not dims.experts_folded:
        return mesh
    from torch.distributed.device_mesh import init_device_mesh

    names, sizes = dims.expert_mesh_shape()
    return init_device_mesh(device_type, sizes, mesh_dim_names=names)


def device_mesh(job: Job, device_type: str):
    """The job's mesh over every rank, or None when the job runs in one process. ZeRO-2/3 of the torch backend is
    FSDP2 even in one process (its offload is how one GPU holds a model larger than itself, and the estimate and
    the tracer model FSDP2 there): it gets a one-rank mesh, over a one-rank process group started here if none
    runs (`leave_one_process_group` ends it)."""
    dims = ParallelDims.from_job(job)
    if not dims.needs_mesh:
        return None
    if dims.world_size == 1:
        join_one_process_group(device_type)
    return build_mesh(dims, device_type)


def fsdp_mesh(mesh, job: Job):
    """The mesh FSDP2 shards over: the dp dimension, or under HSDP the (dp_replicate, dp_shard) pair, on which
    fully_shard shards over the inner dimension and replicates over the outer."""
    return mesh["dp_replicate", "dp_shard"] if job.parallel.dp_replicate > 1 else mesh["dp"]


_OWN_GROUP: list = []
"""The one-rank process group this process started for FSDP2, if it did (ended by leave_one_process_group)."""


def join_one_process_group(device_type: str) -> None:
    """A one-rank process group for FSDP2 in one process, unless a group already runs."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    dist.init_process_group("nccl" if device_type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    _OWN_GROUP.append(dist.group.WORLD)


def leave_one_process_group() -> None:
    """End the one-rank group device_mesh started, so that a later run in the same process (a notebook's) starts
    afresh; a launched rank's group is its launcher's to end."""
    import torch.distributed as dist

    if _OWN_GROUP and dist.is_initialized():
        dist.destroy_process_group()
    _OWN_GROUP.clear()
