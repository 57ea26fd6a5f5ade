"""A Mixture of Experts' memory: one rank of the runner's program (router, grouped experts, the permutation, under
expert parallelism the all-to-all on a fake process group, FSDP2 over the experts' own group) traced on fake
tensors, against the analytic model. Fake tensors have no values, so the trace routes every expert an even share;
the estimate beside it is priced so (toolkit.trace.report.at_even_routing)."""

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory
from toolkit.trace.report import at_even_routing

MOE = {"layers": 2, "hidden": 128, "heads": 4, "vocab": 512, "seq_len": 64, "experts": 4, "experts_per_token": 2}


def traced_job(model: dict, mode: str, devices: int = 1, ep: int = 1, zero: int = 0) -> Job:
    data = {
        "model": {**MOE, **model},
        "batch": {"micro_batch": 2, "global_batch": 2 * devices},
        "precision": {"mode": mode},
        "parallel": {"ep": ep, "zero": zero},
        "cluster": {"count": devices},
        "memory": {"program": "cpu"},
    }
    return at_even_routing(Job.from_dict(data).resolve()[0])


@pytest.mark.parametrize(
    "model, mode, devices, ep, zero",
    [
        ({"mlp": "swiglu", "expert_ffn": 96, "shared_experts": 1, "dense_layers": 1, "ffn": 256}, "amp-bf16", 1, 1, 0),
        ({"mlp": "swiglu", "experts": 8, "expert_ffn": 96}, "pure-bf16", 2, 2, 0),
        ({"router": "sigmoid", "experts_per_token": 1, "expert_ffn": 192}, "fp32", 4, 4, 0),
        ({"expert_ffn": 192}, "fp32", 4, 2, 3),
        ({"mlp": "swiglu", "expert_ffn": 96, "shared_experts": 1}, "amp-bf16", 4, 2, 2),
    ],
    ids=["amp-shared-dense", "pure-bf16-ep2", "sigmoid-top1-ep4", "ep2-zero3-on4", "amp-ep2-zero2-on4"],
)
def test_an_moe_rank_matches_the_model(model, mode, devices, ep, zero):
    job = traced_job(model, mode, devices, ep, zero)
    traced, est = trace_memory(job), memory_estimate(job)
    # states: 1 / ep of the routed experts, sharded by ZeRO over the experts' data-parallel group
    assert est.params_bytes == traced.params_bytes
    assert est.grads_bytes == traced.grads_bytes
    assert est.optimizer_bytes == pytest.approx(traced.optimizer_bytes, abs=1024)  # + Adam's step counters
    assert est.activations_bytes == pytest.approx(traced.activations_bytes, rel=0.005)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.01)
