"""QLoRA: NF4 weights with double quantization (bytes as bitsandbytes lays them out), trained under LoRA
adapters by the runner, and measured by the tracer against the analytic model."""

import pytest
import torch

from toolkit.estimate.memory import memory_estimate
from toolkit.estimate.states import nf4_matrix_bytes
from toolkit.program.qlora import NF4_LEVELS, NF4Linear
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory

QLORA = {"method": "qlora", "rank": 4, "targets": ["q", "v"]}


def test_nf4_round_trip_and_bytes():
    torch.manual_seed(0)
    linear = torch.nn.Linear(512, 256, bias=False)
    torch.nn.init.normal_(linear.weight, std=0.02)  # weights are near-normal: what NF4 is built for
    q = NF4Linear(linear, compute_dtype=torch.float32)
    error = (q.dequantize() - linear.weight).norm() / linear.weight.norm()
    assert 0.02 < error < 0.12  # 4 bits: lossy, but within ~10 %
    stored = sum(b.numel() * b.element_size() for b in q.buffers())
    assert stored == 512 * 256 / 2 + 512 * 256 / 64 + 4 * 512 * 256 / (64 * 256) + 4 + 16 * 4
    assert nf4_matrix_bytes(512 * 256) == stored - 16 * 2  # the estimate's table is bf16, this one fp32
    levels = set(torch.tensor(NF4_LEVELS)[torch.cat((q.codes >> 4, q.codes & 15)).long()].tolist())
    assert len(levels) == 16  # every level in use
    x = torch.randn(3, 512, requires_grad=True)
    q(x).sum().backward()
    reference = x.detach().clone().requires_grad_(True)
    (reference @ q.dequantize().t()).sum().backward()
    assert torch.allclose(x.grad, reference.grad)  # backward dequantizes the same weight again


def test_the_runner_trains_only_the_adapters_over_frozen_nf4(train):
    records, state = train(
        model={"hidden": 128}, precision={"mode": "amp-bf16"}, finetune=QLORA, training={"steps": 4, "lr": 1e-2}
    )
    model = state["model"]
    assert model["blocks.0.mlp.up.codes"].dtype == torch.uint8
    assert model["blocks.0.attn.q.base.codes"].numel() == 128 * 128 // 2
    trained = {k for k in model if k.endswith((".a", ".b"))}
    assert trained == {f"blocks.{i}.attn.{p}.{ab}" for i in range(2) for p in "qv" for ab in "ab"}
    assert len(state["optimizer"]["state"]) == len(trained)
    assert all(r["loss"] == r["loss"] for r in records) and records[-1]["loss"] < records[0]["loss"]


@pytest.mark.parametrize(
    "mode, targets, vocab", [("amp-bf16", ["q", "v"], 32000), ("pure-bf16", ["q", "k", "v", "o", "up", "down"], 1000)]
)
def test_qlora_trace_matches_the_model(mode, targets, vocab):
    model = {
        "preset": "llama2-7b",
        "layers": 2,
        "hidden": 512,
        "heads": 8,
        "kv_heads": 2,
        "ffn": 1536,
        "seq_len": 128,
        "vocab": vocab,
    }
    job, _ = Job.from_dict(
        {
            "model": model,
            "batch": {"micro_batch": 1, "global_batch": 1},
            "precision": {"mode": mode},
            "finetune": dict(QLORA, targets=targets),
            "memory": {"program": "cpu"},
        }
    ).resolve()
    traced, est = trace_memory(job), memory_estimate(job)
    assert est.params_bytes == traced.params_bytes  # NF4 codes, scales, 16-bit embeddings, adapters
    assert est.activations_bytes == traced.activations_bytes
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)  # (the dequantizing moment: 2.5 % high)


def test_qlora_refuses_matrices_nf4_cannot_pack():
    with pytest.raises(SpecError, match="multiples of 16,384 weights"):
        Job.from_dict(
            {"model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}, "finetune": QLORA}
        ).resolve()
