"""The kernel model against the kernel-level measurements it cites (toolkit/data/kernels.yaml), never against
training runs: GEMM time by shape on Hopper, the best matmul rate on both generations, fused attention by
sequence, and the choice of implementation."""

import pytest

from toolkit.estimate.kernels import attention_fraction, attention_kernel_of, gemm_s, kernel_profile
from toolkit.specs import SpecError

# OpenXLA's measured GEMM throughput for sm_90 (tensorflow third_party/xla/xla/service/gpu/model/
# matmul_interpolator_data.h at 372d578b, kDefaultMatmulPTable, bf16xbf16->bf16, batch 1), TFLOP/s by (m, n, k):
# every product of the table whose dimensions are all 1024 or more.
XLA_SM90_TFLOPS = {
    (1024, 1024, 2048): 350.0,
    (1024, 2048, 1024): 373.3,
    (1024, 2048, 2048): 524.3,
    (1024, 4096, 1024): 490.3,
    (2048, 2048, 2048): 632.0,
    (2048, 4096, 1024): 594.2,
    (4096, 1024, 1024): 488.1,
    (4096, 1024, 4096): 738.5,
    (4096, 4096, 2048): 738.7,
    (4096, 4096, 4096): 783.3,
}
H100_PEAK, H100_HBM = 989.4e12, 3.35e12


@pytest.mark.parametrize("shape", sorted(XLA_SM90_TFLOPS))
def test_a_products_time_on_hopper_is_within_10_percent_of_xlas_measured_table(shape):
    m, n, k = shape
    prof = kernel_profile("H100-SXM")
    seconds = gemm_s(m, k, n, H100_PEAK, H100_HBM * prof.memory_fraction, 2, prof)
    assert 2 * m * n * k / seconds / 1e12 == pytest.approx(XLA_SM90_TFLOPS[shape], rel=0.10)


@pytest.mark.parametrize("accelerator, peak, mamf", [("A100-80GB", 312e12, 271.2), ("H100-SXM", 989e12, 794.5)])
def test_a_large_product_runs_at_the_published_maximum_achievable_matmul_rate(accelerator, peak, mamf):
    """ml-engineering's MAMF table (744d01e1): A100 SXM 271.2, H100 SXM 794.5 TFLOPS bf16. A product of 16k
    rows, 8k wide, fills every SM's waves and is far past its fixed time."""
    prof = kernel_profile(accelerator)
    m = n = 16384
    k = 8192
    seconds = gemm_s(m, k, n, peak, 3e12, 2, prof)
    assert 2 * m * n * k / seconds / 1e12 == pytest.approx(mamf, rel=0.02)


# FlashAttention-2 paper, forward + backward TFLOP/s (A100: Fig. 4; H100: Fig. 7), head dim 128, at 2k and 8k
FA2_TABLE = [
    ("A100-80GB", 312e12, False, 2048, 187),
    ("A100-80GB", 312e12, False, 8192, 201),
    ("A100-80GB", 312e12, True, 2048, 155),
    ("A100-80GB", 312e12, True, 8192, 182),
    ("H100-SXM", 989e12, False, 2048, 320),
    ("H100-SXM", 989e12, True, 8192, 308),
]


@pytest.mark.parametrize("accelerator, peak, causal, seq, tflops", FA2_TABLE)
def test_flash_attention_2_runs_at_its_papers_rate(accelerator, peak, causal, seq, tflops):
    prof = kernel_profile(accelerator)
    assert attention_fraction(prof, "fa2", seq, 128, causal) * peak / 1e12 == pytest.approx(tflops, rel=0.01)


def test_between_measured_lengths_the_rate_is_interpolated_and_beyond_them_held():
    prof = kernel_profile("A100-80GB")
    at_3k = attention_fraction(prof, "fa2", 3072, 128, True) * 312
    assert 155 < at_3k < 173  # between 2k's 155 and 4k's 173
    assert attention_fraction(prof, "fa2", 131072, 128, True) * 312 == pytest.approx(189)  # 16k's, held


def test_each_backend_runs_its_usual_attention_and_a_missing_one_is_refused_in_one_line():
    hopper, ampere = kernel_profile("H100-SXM"), kernel_profile("A100-80GB")
    assert attention_kernel_of(hopper, "megatron", None) == "cudnn"
    assert attention_kernel_of(hopper, "torch", None) == "fa2"
    assert attention_kernel_of(ampere, "megatron", None) == "fa2"
    with pytest.raises(SpecError, match="'fa3'.*no kernel measurement on ampere"):
        attention_kernel_of(ampere, "torch", "fa3")
    assert kernel_profile("MI300X") is None  # no profile: the model's stated assumptions


def test_hopper_runs_attention_faster_with_fa3_than_fa2_as_its_paper_measured():
    prof = kernel_profile("H100-SXM")
    assert attention_fraction(prof, "fa3", 8192, 128, True) > 1.5 * attention_fraction(prof, "fa2", 8192, 128, True)
