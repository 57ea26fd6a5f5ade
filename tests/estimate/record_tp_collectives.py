"""Run the runner's tensor-parallel GPT (toolkit.program.parallel.tensor_parallel) for one micro-batch on real gloo
ranks and count the collectives torch's profiler records, by size.

    torchrun --nproc-per-node 2 record_tp_collectives.py OUT.json

The reference for toolkit.estimate.comm.tp_collectives_per_block: what the program issues, not a formula.
Rank 0 writes OUT.json: {case: {"activation": all-reduce equivalents of block activations, "small": the rest}}.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.profiler import ProfilerActivity, profile

from toolkit.program.model import GPT
from toolkit.program.parallel import loss_parallel, tensor_parallel
from toolkit.specs.job import ModelSpec

CASES = {
    "gelu": ({"mlp": "gelu"}, False, "none"),
    "swiglu": ({"mlp": "swiglu", "norm": "rmsnorm"}, False, "none"),
    "gelu-sp": ({"mlp": "gelu"}, True, "none"),
    "gelu-full-recompute": ({"mlp": "gelu"}, False, "full"),
    "swiglu-per-op-recompute": ({"mlp": "swiglu", "norm": "rmsnorm"}, False, "selective-op"),
    "gelu-sp-per-op-recompute": ({"mlp": "gelu"}, True, "selective-op"),
}
LAYERS, HIDDEN, SEQ, MICRO = 3, 64, 16, 2
KINDS = {
    "_c10d_functional::all_reduce": 1.0,
    "_c10d_functional::all_gather_into_tensor": 0.5,
    "_c10d_functional::reduce_scatter_tensor": 0.5,
}  # a gather and a reduce-scatter move one all-reduce's bytes


def _inside_itself(event) -> bool:
    """A collective that per-op recompute's dispatch mode (torch's selective checkpoint) passes on is recorded
    twice, the real call inside the mode's; count it once."""
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == event.name:
            return True
        parent = parent.cpu_parent
    return False


def count(shape_fields: dict, sp: bool, recompute: str, mesh) -> dict:
    spec = ModelSpec(layers=LAYERS, hidden=HIDDEN, heads=4, vocab=128, seq_len=SEQ, **shape_fields)
    torch.manual_seed(0)
    model = tensor_parallel(GPT(spec, recompute=recompute), mesh, sp)
    tokens = torch.randint(0, spec.vocab, (MICRO, SEQ + 1))
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof, loss_parallel():
        model(tokens[:, :-1], tokens[:, 1:]).backward()
    found = {"activation": 0.0, "small": 0.0}
    for event in prof.events():
        if event.name in KINDS and not _inside_itself(event):
            numel = torch.Size(event.input_shapes[0]).numel()
            found["activation" if numel * mesh.size() >= MICRO * SEQ * HIDDEN else "small"] += KINDS[event.name]
    return found


def main() -> None:
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    counts = {name: count(*case, mesh) for name, case in CASES.items()}
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(counts, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
