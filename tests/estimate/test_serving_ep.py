"""Expert-parallel serving (vLLM's --enable-expert-parallel, SGLang's --ep-size with attention data parallel):
what a device holds against the model's published size, the dispatch across nodes against DeepEP's published
low-latency timings, and the layouts refused in one line."""

from __future__ import annotations

import pytest

from toolkit.estimate.serving_memory import weight_bytes
from toolkit.estimate.serving_time import ServingClock, serving_hardware
from toolkit.specs import Job, load_catalog
from toolkit.specs.errors import SpecError
from toolkit.specs.resolve import resolve_job

CATALOG = load_catalog()
MIXTRAL_TOTAL_PARAMS = 46.7e9
"""Mistral AI, "Mixtral of experts" (2023-12-11): "46.7B total parameters"."""
MIXTRAL_ROUTED_PARAMS = 8 * 32 * 3 * 4096 * 14336
"""Its routed experts from its config.json: 8 experts of gate, up and down (4,096 × 14,336) in each of 32 layers."""


def _serving(spec: dict) -> Job:
    base = {"workload": "inference", "serving": {"input_tokens": 512, "output_tokens": 256}}
    job, _ = resolve_job(Job.from_dict(base | spec, CATALOG), CATALOG)
    return job


@pytest.mark.parametrize(("tp", "ep", "count"), [(2, 8, 8), (8, 8, 8), (1, 4, 4)])
def test_a_device_holds_its_tp_slice_of_the_rest_and_experts_over_ep_whole(tp, ep, count):
    job = _serving({"model": {"preset": "mixtral-8x7b"}, "cluster": {"accelerator": "H100-SXM", "count": count},
                    "parallel": {"tp": tp, "ep": ep}})  # fmt: skip
    matrices, other = weight_bytes(job)
    expected = ((MIXTRAL_TOTAL_PARAMS - MIXTRAL_ROUTED_PARAMS) / tp + MIXTRAL_ROUTED_PARAMS / ep) * 2
    assert matrices + other == pytest.approx(expected, rel=0.02)


@pytest.mark.parametrize(("ep", "measured_us"), [(16, 118 + 195), (32, 155 + 273), (64, 173 + 314)])
def test_decode_dispatch_across_nodes_takes_deepeps_low_latency_time(ep, measured_us):
    """DeepEP README (H800, 128 tokens a rank, hidden 7,168, top-8, FP8 dispatch, BF16 combine): the model's
    DeepSeek-V3 at the same shape on H800 nodes of 8 with one 400 Gb/s NIC a GPU."""
    job = _serving({"model": {"hf_config": "tests/fixtures/hf/deepseek-v3"},
                    "cluster": {"accelerator": "H800", "count": ep}, "parallel": {"tp": 1, "ep": ep},
                    "serving": {"weights": "fp8", "input_tokens": 512, "output_tokens": 256}})  # fmt: skip
    clock = ServingClock(job, serving_hardware(job, CATALOG))
    assert clock.hw.inter_bw_bytes_per_s == pytest.approx(50e9, rel=0.05)
    assert clock._dispatch_combine_s(128) * 1e6 == pytest.approx(measured_us, rel=0.05)


@pytest.mark.parametrize(
    ("model", "tp", "ep", "words"),
    [("mixtral-8x7b", 4, 2, "multiple of tp = 4"), ("llama3-8b", 2, 2, "has none")],
)
def test_layouts_serving_cannot_run_are_refused_in_one_line(model, tp, ep, words):
    with pytest.raises(SpecError, match=words) as err:
        _serving({"model": {"preset": model}, "cluster": {"accelerator": "H100-SXM", "count": 8},
                  "parallel": {"tp": tp, "ep": ep}})  # fmt: skip
    assert "\n" not in str(err.value)
