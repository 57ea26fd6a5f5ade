"""QLoRA's step pays for dequantizing its frozen NF4 matrices before each product: the step-time model's extra
memory-bound time against the bytes the runner's NF4Linear buffers hold (codes, absmax, scales, read) and the
16-bit weight each dequantize writes, forward and backward, and once more under full recompute."""

import dataclasses

import pytest
import torch

from toolkit.estimate import estimate
from toolkit.estimate.hardware import hardware_for
from toolkit.program.build import build_model
from toolkit.program.qlora import NF4Linear, apply_qlora
from toolkit.specs import Job, load_catalog


def _job(method: str, recompute: str) -> Job:
    return Job.from_dict(
        {
            "model": {
                "layers": 2,
                "hidden": 512,
                "heads": 8,
                "vocab": 512,
                "seq_len": 256,
                "ffn": 1536,
                "mlp": "swiglu",
            },
            "batch": {"micro_batch": 1, "global_batch": 1},
            "precision": {"mode": "pure-bf16"},
            "memory": {"recompute": recompute},
            "finetune": {"method": method, "rank": 8},
            "cluster": {"accelerator": "H100-SXM", "count": 1},
        }
    ).resolve()[0]


def nf4_bytes_read_and_written(job: Job) -> float:
    """One dequantize of every NF4Linear the runner builds: its buffers read, the weight written in bf16."""
    model = build_model(
        dataclasses.replace(job, finetune=dataclasses.replace(job.finetune, method="none")), torch.bfloat16
    )
    apply_qlora(model, job.finetune.rank, job.finetune.alpha, job.finetune.targets)
    linears = [m for m in model.modules() if isinstance(m, NF4Linear)]
    read = sum(b.numel() * b.element_size() for m in linears for b in m.buffers())
    return read + sum(2 * m.in_features * m.out_features for m in linears)


@pytest.mark.parametrize("recompute, uses", [("none", 2), ("full", 3)])
def test_qlora_adds_its_dequantize_traffic_to_a_lora_step(recompute, uses):
    qlora, lora = _job("qlora", recompute), _job("lora", recompute)
    extra_s = (
        estimate(qlora)["time"]["breakdown"]["memory_bound_s"] - estimate(lora)["time"]["breakdown"]["memory_bound_s"]
    )
    hw = hardware_for(qlora, load_catalog())
    moved = uses * nf4_bytes_read_and_written(qlora)
    assert extra_s * hw.memory_bw_bytes_per_s * hw.kernels.sustained_fraction == pytest.approx(moved, rel=0.02)
