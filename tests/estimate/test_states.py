"""Model-state bytes for every precision × optimizer × ZeRO stage against hand-derived formulas."""

import itertools

import pytest

from toolkit.estimate import count_params, model_state_bytes, params_per_device
from toolkit.specs import PRECISIONS, TORCH_SEMANTICS, Job

N = 1_000_000_000
DP = 8

# Bytes per parameter (weights, grads, optimizer incl. fp32 master), written out by hand per mode.
ADAM = {
    "fp32": (4, 4, 8),
    "amp-bf16": (4, 4, 8),
    "amp-fp16": (4, 4, 8),
    "mixed-bf16": (2, 2, 12),
    "mixed-fp16": (2, 2, 12),
    "pure-bf16": (2, 2, 4),
}
SGD_MOMENTUM = {
    "fp32": (4, 4, 4),
    "amp-bf16": (4, 4, 4),
    "amp-fp16": (4, 4, 4),
    "mixed-bf16": (2, 2, 8),
    "mixed-fp16": (2, 2, 8),
    "pure-bf16": (2, 2, 2),
}
SGD_PLAIN = {
    "fp32": (4, 4, 0),
    "amp-bf16": (4, 4, 0),
    "amp-fp16": (4, 4, 0),
    "mixed-bf16": (2, 2, 4),
    "mixed-fp16": (2, 2, 4),
    "pure-bf16": (2, 2, 0),
}
EIGHT_BIT = 2 + 2 * 4 / 256  # two int8 states + one fp32 scale per 256-element block each
ADAM8 = {m: (w, g, EIGHT_BIT + (4 if m.startswith("mixed") else 0)) for m, (w, g, _) in ADAM.items()}
TABLES = {
    ("adamw", 0.9): ADAM,
    ("adam", 0.9): ADAM,
    ("sgd", 0.9): SGD_MOMENTUM,
    ("sgd", 0.0): SGD_PLAIN,
    ("adamw-8bit", 0.9): ADAM8,
}


def expected(mode: str, zero: int, w: float, g: float, o: float) -> tuple[float, float, float]:
    """Per-device (weights, grads, optimizer) bytes. torch: ZeRO-2 = FSDP2, persistent weights sharded."""
    shard_w = DP if zero == 3 or (zero == 2 and mode in TORCH_SEMANTICS) else 1
    return N * w / shard_w, N * g / (DP if zero >= 2 else 1), N * o / (DP if zero >= 1 else 1)


def job(mode, opt, momentum, zero, **parallel) -> Job:
    j = Job.from_dict(
        {
            "model": {"params": N},
            "precision": {"mode": mode},
            "optimizer": {"name": opt, "momentum": momentum},
            "parallel": {"zero": zero, **parallel},
            "cluster": {"count": DP},
        }
    )
    return j.resolve()[0]


@pytest.mark.parametrize("mode, opt_momentum, zero", list(itertools.product(PRECISIONS, TABLES, (0, 1, 2, 3))))
def test_state_bytes_match_hand_formula(mode, opt_momentum, zero):
    opt, momentum = opt_momentum
    states = model_state_bytes(job(mode, opt, momentum, zero))
    want = expected(mode, zero, *TABLES[opt_momentum][mode])
    assert (states.params_bytes, states.grads_bytes, states.optimizer_bytes) == pytest.approx(want)
    assert states.host_bytes == 0


def test_zero_paper_figure_1():
    """ZeRO paper (arXiv 1910.02054) Fig. 1: Ψ = 7.5B, Nd = 64, mixed precision Adam: 120, 31.4, 16.6, 1.9 GB."""
    psi, nd = 7.5e9, 64
    got = []
    for zero in range(4):
        j = Job.from_dict(
            {
                "model": {"params": psi},
                "precision": {"mode": "mixed-fp16"},
                "parallel": {"zero": zero},
                "cluster": {"count": nd},
            }
        ).resolve()[0]
        got.append(model_state_bytes(j).total_bytes / 1e9)
    assert got == pytest.approx([120, 31.4, 16.6, 1.875], abs=0.05)


def test_megatron_fp32_main_grads():
    """Megatron: 18 bytes/param; distributed optimizer 6 + 12/d (theoretical_memory_usage.py)."""
    base = {"model": {"params": N}, "precision": {"mode": "mixed-bf16", "grad_dtype": "fp32"}, "cluster": {"count": DP}}
    plain = Job.from_dict(base).resolve()[0]
    dist = Job.from_dict({**base, "parallel": {"zero": 1}}).resolve()[0]
    assert model_state_bytes(plain).total_bytes == pytest.approx(18 * N)
    assert model_state_bytes(dist).total_bytes == pytest.approx((6 + 12 / DP) * N)


def test_deepspeed_optimizer_offload_moves_master_and_moments_to_host():
    j = Job.from_dict(
        {
            "model": {"params": N},
            "precision": {"mode": "mixed-bf16"},
            "parallel": {"zero": 2, "offload": "optimizer"},
            "cluster": {"count": DP},
        }
    ).resolve()[0]
    s = model_state_bytes(j)
    assert (s.params_bytes, s.grads_bytes, s.optimizer_bytes) == pytest.approx((2 * N, 2 * N / DP, 0))
    assert s.host_bytes == pytest.approx(12 * N / DP)


def test_fsdp_param_offload_moves_everything_to_host():
    j = Job.from_dict(
        {
            "model": {"params": N},
            "precision": {"mode": "amp-bf16"},
            "parallel": {"zero": 3, "offload": "params"},
            "cluster": {"count": DP},
        }
    ).resolve()[0]
    s = model_state_bytes(j)
    assert s.total_bytes == 0
    assert s.host_bytes == pytest.approx(16 * N / DP)


def test_pipeline_busiest_stage_and_tensor_split(catalog):
    gpt2 = catalog.preset("gpt2").model
    c = count_params(gpt2)
    # pp = 2: stage 0 has embeddings + 6 blocks; the last stage 6 blocks + final norm + a tied embedding copy.
    first = c.embedding + c.positions + 6 * c.per_layer
    assert params_per_device(gpt2, tp=1, pp=2) == first
    # tp splits matrices, column biases and the vocabulary; every rank keeps the norms, the o and down
    # biases (added after the row-parallel reduction) and the learned positions whole
    # (the busiest rank takes ceil(V / tp) vocabulary rows)
    replicated = 4 * 768 + 2 * 768
    assert (
        params_per_device(gpt2, tp=2, pp=2)
        == 25129 * 768 + 6 * (c.per_layer - replicated) / 2 + c.positions + 6 * replicated
    )
    assert (
        params_per_device(gpt2, tp=4, pp=1)
        == 12565 * 768 + 12 * (c.per_layer - replicated) / 4 + c.positions + c.final + 12 * replicated
    )


def test_tensor_parallel_divides_states(catalog):
    base = {"model": {"preset": "llama2-7b"}, "cluster": {"accelerator": "A100-80GB", "count": 8}}
    tp1 = model_state_bytes(Job.from_dict({**base, "parallel": {"tp": 1}}).resolve()[0])
    tp8 = model_state_bytes(Job.from_dict({**base, "parallel": {"tp": 8}}).resolve()[0])
    assert tp8.total_bytes == pytest.approx(tp1.total_bytes / 8, rel=1e-3)  # norms stay whole (0.04 %)
    assert tp1.total_bytes == 16 * 6_738_415_616 + 4096 * 128 * 4  # + the fp32 rotary cos/sin tables
