"""Which process groups a rank of DeepSpeed's pipeline engine communicates on, recorded on gloo ranks.

    torchrun --nproc-per-node 8 record_ds_groups.py OUT.json      # dp 2 x tp 2 x pp 2

A Megatron-DeepSpeed-like GPT (tied embeddings in a PipelineModule; each block all-reduces over a tensor-parallel
group of its own, as Megatron's layers do over mpu's) trains one batch of two micro-batches under bf16 and ZeRO-1
with gradient clipping. Every torch.distributed call is wrapped before DeepSpeed binds them; rank 0 (the first
stage) writes the ranks of each group it ran a collective on, one entry per group object, to OUT.json. Point-to-
point sends between stages are left out: the estimate counts those as pipeline neighbours.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch import nn

PP, TP, DP = 2, 2, 2
COLLECTIVES = (
    "all_reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "_all_gather_base",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "_reduce_scatter_base",
    "all_to_all",
    "all_to_all_single",
    "gather",
    "scatter",
    "barrier",
    "all_gather_object",
    "broadcast_object_list",
)
used: dict[int, list[int]] = {}


def record(fn):
    def wrapped(*args, **kwargs):
        group = kwargs.get("group")
        group = dist.group.WORLD if group is None else group
        used.setdefault(id(group), dist.get_process_group_ranks(group))
        return fn(*args, **kwargs)

    return wrapped


def main(out: str) -> None:
    for name in COLLECTIVES:  # (DeepSpeed's torch backend binds some of them when it starts)
        fn = getattr(c10d, name, None)
        if fn is not None:
            for module in (c10d, dist):
                if getattr(module, name, None) is fn:
                    setattr(module, name, record(fn))
    import deepspeed
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec
    from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology

    deepspeed.init_distributed(dist_backend="gloo", auto_mpi_discovery=False)
    topology = PipeModelDataParallelTopology(num_pp=PP, num_mp=TP, num_dp=DP)
    rank = dist.get_rank()
    tp_group = None
    for ranks in topology.get_axis_comm_lists("model"):  # Megatron's mpu builds its own tensor-parallel groups
        group = dist.new_group(ranks)
        tp_group = group if rank in ranks else tp_group

    class Embedding(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(64, 16) * 0.02)

        def forward(self, x):
            return nn.functional.embedding(x, self.weight) if x.dtype == torch.long else x @ self.weight.t()

    class ParallelBlock(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = nn.Linear(16, 16)

        def forward(self, x):
            y = self.linear(x)
            dist.all_reduce(y.detach(), group=tp_group)  # (the row-parallel output's reduction)
            return x + y

    layers = [
        TiedLayerSpec("embed", Embedding, tied_weight_attr="weight"),
        *[LayerSpec(ParallelBlock)] * 4,
        TiedLayerSpec("embed", Embedding, tied_weight_attr="weight"),
    ]
    module = PipelineModule(
        layers=layers,
        topology=topology,
        partition_method="uniform",
        loss_fn=lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1).float(), y.flatten()),
    )
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 2,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 1},
        "gradient_clipping": 1.0,
        "steps_per_print": 10**9,
        "optimizer": {"type": "Adam", "params": {"lr": 1e-3, "torch_adam": True}},
    }
    engine, *_ = deepspeed.initialize(model=module, config=config, model_parameters=list(module.parameters()))
    batch = (torch.randint(0, 64, (1, 8)), torch.randint(0, 64, (1, 8)))
    engine.train_batch(iter([batch] * 2))
    if rank == 0:
        with open(out, "w") as f:
            json.dump(sorted(used.values()), f)
    dist.barrier()


if __name__ == "__main__":
    os.environ.setdefault("ACCELERATE_USE_CPU", "1")
    main(sys.argv[1])
