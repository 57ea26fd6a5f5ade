"""int8 saved activations: the estimate counts what the runner's hooks pack, byte for byte on the trace."""

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory

BASE = {
    "model": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 256, "seq_len": 1024},
    "batch": {"micro_batch": 4},
    "memory": {"act_compress": "int8", "program": "cpu"},
}


def _job(precision, **model):
    data = {**BASE, "model": {**BASE["model"], **model}, "precision": {"mode": precision}}
    return Job.from_dict(data).resolve()[0]


@pytest.mark.parametrize(
    "precision, model",
    [
        ("fp32", {}),
        ("amp-bf16", {}),
        ("pure-bf16", {"mlp": "swiglu", "norm": "rmsnorm", "position": "rope"}),
        ("mixed-bf16", {"dropout": 0.1}),
    ],
)
def test_activations_equal_the_trace_and_halve_bf16(precision, model):
    job = _job(precision, **model)
    traced, est = trace_memory(job), memory_estimate(job)
    assert float(est.activations_bytes) == pytest.approx(traced.activations_bytes, rel=1e-3)
    plain = memory_estimate(job.replace(memory=job.memory.__class__(act_compress="none", program="cpu")))
    assert est.activations_bytes < 0.62 * plain.activations_bytes


@pytest.mark.parametrize("precision, model", [("amp-bf16", {}), ("pure-bf16", {"mlp": "swiglu", "norm": "rmsnorm"})])
def test_peak_within_ten_percent_on_flash_attention(precision, model):
    """On this 1024-token job the estimate reads 8.1 % (amp-bf16) and 2.0 % (pure-bf16) below the trace: int8's
    peak packs and unpacks beside what it keeps, which the model counts at the shorter benchmark rows' share
    (docs/accuracy.md's int8 rows). docs/fit.md states this job's 10 % bound."""
    job = _job(precision, **model)
    assert float(memory_estimate(job).peak_bytes) == pytest.approx(trace_memory(job).peak_bytes, rel=0.10)


def test_untraceable_int8_layouts_are_named():
    job = _job("amp-bf16")
    with pytest.raises(SpecError, match="int8 activations are traced with replicas"):
        trace_memory(job.replace(memory=job.memory.__class__(act_compress="int8", recompute="full", program="cpu")))
