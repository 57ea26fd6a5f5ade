"""Split Megatron-DeepSpeed's GPT layer list over pipeline stages with DeepSpeed's own PipelineModule, the layers
built from the runner's modules (toolkit.program.model), on a fake process group of pp ranks.

    LOCAL_RANK=0 python record_ds_partition.py OUT.json

The reference for toolkit.specs.partition: OUT.json maps each case to DeepSpeed's boundaries (`parts`) and the
blocks each stage gets.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.testing._internal.distributed.fake_pg import FakeStore

from toolkit.program.model import Block
from toolkit.specs.job import ModelSpec

# (model fields, pp, method)
SMALL = {"layers": 10, "hidden": 64, "heads": 4, "vocab": 3000, "seq_len": 32}
CASES = {
    "parameters pp4": (SMALL, 4, "parameters"),
    "parameters pp3 learned untied": ({**SMALL, "position": "learned", "tie_embeddings": False}, 3, "parameters"),
    "uniform pp4": (SMALL, 4, "uniform"),
    "uniform pp3 swiglu rmsnorm": ({**SMALL, "mlp": "swiglu", "norm": "rmsnorm"}, 3, "uniform"),
    "type:transformer pp4": (SMALL, 4, "type:transformer"),
    "type:transformer|embedding pp4": (SMALL, 4, "type:transformer|embedding"),
    "type:transformer|embedding pp3 13 layers": ({**SMALL, "layers": 13}, 3, "type:transformer|embedding"),
    "parameters pp8 embedding alone": (SMALL, 8, "parameters"),
}


def gpt_model_pipe(spec: ModelSpec):
    """GPTModelPipe's list (bigscience-workshop/Megatron-DeepSpeed, megatron/model/gpt_model.py) in bf16."""
    from deepspeed.pipe import LayerSpec, TiedLayerSpec

    class EmbeddingPipe(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(spec.vocab, spec.hidden))
            self.pos = nn.Embedding(spec.max_positions_, spec.hidden) if spec.position == "learned" else None

    class LMHeadPipe(nn.Linear):
        def __init__(self):
            super().__init__(spec.hidden, spec.vocab, bias=False)

    ParallelTransformerLayerPipe = type("ParallelTransformerLayerPipe", (Block,), {})
    norm = type("LayerNorm", (nn.LayerNorm,), {}) if spec.norm == "layernorm" else type("RMSNorm", (nn.RMSNorm,), {})

    def _to_float16(x):
        return x

    def float16_to_fp32(x):
        return x

    layers = [_to_float16, TiedLayerSpec("embed", EmbeddingPipe, tied_weight_attr="weight"), lambda x: x]
    layers += [LayerSpec(ParallelTransformerLayerPipe, spec, "eager", False) for _ in range(spec.layers)]
    layers += [lambda x: x, LayerSpec(norm, spec.hidden)]
    layers += [
        TiedLayerSpec("embed", EmbeddingPipe, tied_weight_attr="weight")
        if spec.tie_embeddings
        else LayerSpec(LMHeadPipe)
    ]
    return layers + [float16_to_fp32]


def main(out: str) -> None:
    import deepspeed.comm
    from deepspeed.pipe import PipelineModule

    recorded = {}
    for name, (fields, pp, method) in CASES.items():
        dist.init_process_group("fake", rank=0, world_size=pp, store=FakeStore())
        deepspeed.comm.init_distributed(dist_backend="fake", auto_mpi_discovery=False)
        spec = ModelSpec(**fields)
        module = PipelineModule(layers=gpt_model_pipe(spec), num_stages=pp, partition_method=method)
        parts = [int(p) for p in module.parts]
        names = [getattr(getattr(s, "typename", s), "__name__", "") for s in module._layer_specs]
        blocks = [names[a:b].count("ParallelTransformerLayerPipe") for a, b in zip(parts, parts[1:])]
        recorded[name] = {"parts": parts, "blocks": blocks}
        dist.destroy_process_group()
        deepspeed.comm.comm.cdb = None  # the next case starts a process group of its own size
    with open(out, "w") as f:
        json.dump(recorded, f)


if __name__ == "__main__":
    main(sys.argv[1])
