"""What people deploy, in the load simulation: speculative decoding makes Leviathan et al.'s expected tokens a step,
a prefix cache spares its share of the prefill, disaggregated decode workers keep prefill chunks out of decode
steps, and 4-bit float weights take their formats' scale bits (OCP MX v1.0: 8 bits per 32; NVFP4: 8 per 16)."""

import numpy as np
import pytest

from toolkit.estimate import estimate
from toolkit.estimate.serving_load import spec_tokens_per_step
from toolkit.estimate.serving_memory import matrix_bits
from toolkit.estimate.serving_sim import Load, StepTable, arrivals, simulate
from toolkit.specs import Job


def linear_table(per_token_s: float, decode_s: float, **extra) -> StepTable:
    rows = np.array([1.0, 1e5])
    return StepTable(rows, np.full(2, decode_s), per_token_s * rows, 0.0, 0.0, 0.0, **extra)


def test_speculative_decoding_makes_the_expected_accepted_tokens_a_step():
    # Leviathan, Kalman, Matias (ICML 2023), eq. 1: k = 3 drafts at acceptance 0.7 make 2.533 tokens a step
    assert spec_tokens_per_step(3, 0.7) == pytest.approx((1 - 0.7**4) / 0.3)
    assert spec_tokens_per_step(3, 1.0) == 4 and spec_tokens_per_step(0, 0.5) == 1
    per = spec_tokens_per_step(3, 0.7)
    plain = Load(np.full(50, 10), np.full(50, 1001), concurrency=1)
    spec = Load(np.full(50, 10), np.full(50, 1001), concurrency=1, tokens_per_step=per)
    table = linear_table(0.0, 0.01)
    limits = {"max_num_seqs": 4, "max_batched_tokens": 512, "kv_tokens": 1e9}
    ratio = simulate(table, plain, **limits)["tpot_s"]["mean"] / simulate(table, spec, **limits)["tpot_s"]["mean"]
    assert ratio == pytest.approx(per, rel=0.01)  # the step costs the same here: time per token falls by it


def test_a_prefix_cache_spares_its_share_of_the_prefill():
    table = linear_table(1e-4, 0.001)
    limits = {"max_num_seqs": 4, "max_batched_tokens": 4096, "kv_tokens": 1e9}
    cold = simulate(table, arrivals(requests=20, input_tokens=2000, output_tokens=2, concurrency=1), **limits)
    warm = simulate(
        table, arrivals(requests=20, input_tokens=2000, output_tokens=2, concurrency=1, cached_tokens=1500), **limits
    )
    assert warm["ttft_s"]["mean"] == pytest.approx(cold["ttft_s"]["mean"] / 4, rel=0.01)


@pytest.fixture(scope="module")
def llama70b(catalog):
    def serving(**extra):
        spec = {
            "workload": "inference",
            "model": {"preset": "llama3-70b"},
            "cluster": {"accelerator": "H100-SXM", "count": 8},
            "parallel": {"tp": 4},
            "serving": {"weights": "fp8", "input_tokens": 2000, "output_tokens": 256, "rate": 4, "requests": 400,
                        **extra},
        }  # fmt: skip
        return estimate(Job.from_dict(spec, catalog), catalog)["serving"]

    return serving


def test_disaggregated_decode_steps_carry_no_prefill(llama70b):
    together, apart = llama70b(), llama70b(prefill_workers=1, decode_workers=1)
    assert apart["tpot_s_p99"] < together["tpot_s_p99"]
    assert apart["tpot_s_p99"] == pytest.approx(apart["tpot_s_p50"], rel=0.1)  # no prefill chunk in a decode step


def test_disaggregation_needs_both_pools_and_a_rate(catalog):
    from toolkit.specs import SpecError

    base = {"workload": "inference", "model": {"preset": "llama3-8b"}, "cluster": {"accelerator": "H100-SXM"}}
    with pytest.raises(SpecError, match="decode-workers"):
        Job.from_dict({**base, "serving": {"prefill_workers": 1, "rate": 1}}, catalog).resolve(catalog)
    with pytest.raises(SpecError, match="--rate"):
        Job.from_dict({**base, "serving": {"prefill_workers": 1, "decode_workers": 1}}, catalog).resolve(catalog)


@pytest.mark.parametrize(("weights", "bits"), [("mxfp4", 4.25), ("fp4", 4.25), ("nvfp4", 4.5)])
def test_four_bit_float_weights_carry_their_scales(catalog, weights, bits):
    job = Job.from_dict(
        {"workload": "inference", "model": {"preset": "llama3-8b"}, "cluster": {"accelerator": "H100-SXM"},
         "serving": {"weights": weights}},
        catalog,
    ).resolve(catalog)[0]  # fmt: skip
    assert matrix_bits(job) == pytest.approx(bits)
