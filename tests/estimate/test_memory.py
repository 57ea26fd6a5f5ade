"""The analytic memory model against the fake-tensor trace of the runner's real training step."""

import itertools

import pytest

from toolkit.estimate.activations import activation_bytes
from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory

TINY_GPT = {"layers": 2, "hidden": 48, "heads": 6, "vocab": 101, "seq_len": 20, "max_positions": 32, "ffn": 100}
TINY_LLAMA = dict(TINY_GPT, mlp="swiglu", norm="rmsnorm", position="rope", bias="none", kv_heads=2)


def job(model, mode="amp-bf16", b=3, accum=1, rec="none", att="flash", opt="adamw", impl=None, grads="param") -> Job:
    return Job.from_dict(
        {
            "model": model,
            "batch": {"micro_batch": b, "global_batch": b * accum},
            "precision": {"mode": mode, "grad_dtype": grads},
            "optimizer": {"name": opt, "impl": impl},
            "memory": {"recompute": rec, "attention": att, "program": "cpu"},
        }
    ).resolve()[0]


# A representative slice of benchmarks/memory_accuracy.py: every option at least once.
ACTIVATION_CASES = [
    (arch, mode, att, drop, rec)
    for (arch, mode), att, drop, rec in itertools.chain(
        itertools.product(
            (("gpt", "fp32"), ("llama", "amp-bf16"), ("llama", "pure-bf16"), ("gpt", "mixed-fp16")),
            ("flash", "eager"),
            (0.0, 0.1),
            ("none",),
        ),
        itertools.product(
            (("gpt", "amp-fp16"), ("llama", "fp32")),
            ("flash", "eager"),
            (0.0, 0.1),
            ("selective", "selective-op", "full"),
        ),
    )
]


@pytest.mark.parametrize(
    "arch, mode, att, dropout, rec", ACTIVATION_CASES, ids=["/".join(map(str, c)) for c in ACTIVATION_CASES]
)
def test_activations_match_trace_to_the_byte(arch, mode, att, dropout, rec):
    model = dict(TINY_GPT if arch == "gpt" else TINY_LLAMA, dropout=dropout)
    j = job(model, mode=mode, att=att, rec=rec, accum=2)
    assert activation_bytes(j).total == trace_memory(j).activations_bytes


SMALL_LLAMA = {"preset": "llama2-7b", "layers": 3, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 688, "seq_len": 256}
SMALL_GPT = {"preset": "gpt2", "layers": 3, "hidden": 192, "heads": 3, "seq_len": 256, "max_positions": 256}
PEAK_CASES = {
    "loss-bound": (SMALL_LLAMA, {}),
    "fp32-eager-foreach": (SMALL_GPT, {"mode": "fp32", "att": "eager", "impl": "foreach"}),
    "full-recompute-small-vocab": (dict(SMALL_LLAMA, vocab=500), {"rec": "full", "b": 4}),
    "accumulate-full-recompute": (dict(SMALL_GPT, vocab=500), {"rec": "full", "b": 1, "accum": 2}),
    "optimizer-step-bound": (dict(SMALL_GPT, vocab=500), {"b": 1}),
    "mixed-master-weights": (dict(SMALL_LLAMA, vocab=500), {"mode": "mixed-bf16", "rec": "full", "b": 1}),
    "pure-bf16-sgd": (SMALL_LLAMA, {"mode": "pure-bf16", "opt": "sgd", "rec": "selective"}),
    # torchtitan's per-op policy: every other matmul's output kept, autocast's casts cached through forward
    "per-op-recompute-accumulating": (dict(SMALL_LLAMA, vocab=500), {"rec": "selective-op", "b": 4, "accum": 2}),
    # Megatron's fp32 main gradients exist from start-up: at the loss (first) and at an accumulating step
    "fp32-main-grads-at-the-loss": (SMALL_GPT, {"mode": "mixed-bf16", "grads": "fp32"}),
    "fp32-main-grads-accumulating": (
        dict(SMALL_LLAMA, vocab=500),
        {"mode": "mixed-fp16", "grads": "fp32", "b": 1, "accum": 2, "impl": "foreach"},
    ),
}


@pytest.mark.parametrize("name", PEAK_CASES)
def test_peak_within_three_percent(name):
    model, options = PEAK_CASES[name]
    j = job(model, **options)
    traced, model_mem = trace_memory(j), memory_estimate(j)
    assert model_mem.params_bytes + model_mem.optimizer_bytes == pytest.approx(
        traced.params_bytes + traced.optimizer_bytes, rel=3e-3
    )  # rope tables and step counters aside
    assert model_mem.grads_bytes == traced.grads_bytes
    assert model_mem.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03), model_mem.phases


def test_phases_move_with_the_job():
    base = job(dict(SMALL_LLAMA, vocab=32000), b=2)
    assert memory_estimate(base).peak_phase == "loss"  # big vocabulary: cross-entropy grads
    wide = {"preset": "gpt2", "layers": 4, "hidden": 384, "heads": 6, "seq_len": 256, "max_positions": 256}
    small_vocab = memory_estimate(job(dict(wide, vocab=1000), b=1))
    assert small_vocab.peak_phase == "optimizer step"  # weights dominate: grads + Adam temps
    accumulated = memory_estimate(job(SMALL_LLAMA, b=2, accum=2))
    assert accumulated.phases["loss"] - memory_estimate(base).phases["loss"] != 0
    loop, foreach, fused = (
        memory_estimate(job(SMALL_LLAMA, impl=i)).phases["optimizer step"] for i in ("for-loop", "foreach", "fused")
    )
    assert fused < loop < foreach


def test_activations_scale_with_micro_batch():
    one, four = (activation_bytes(job(SMALL_LLAMA, mode="fp32", b=b)) for b in (1, 4))
    assert four.per_layer == 4 * one.per_layer
    assert four.head == pytest.approx(4 * one.head, rel=1e-4)  # but for two loss scalars
    # Under autocast the bf16 weight casts and the rope tables' casts are saved once, whatever the batch.
    h, q, kv, f, s, head_dim = 256, 256, 128, 688, 256, 64
    constant = 2 * (2 * h * q + 2 * h * kv + 3 * h * f) + 4 * s * (head_dim // 2) * 2
    amp_one, amp_four = (activation_bytes(job(SMALL_LLAMA, b=b)) for b in (1, 4))
    assert amp_four.per_layer - 4 * amp_one.per_layer == -3 * constant


def test_cuda_program_keeps_byte_masks():
    cpu = job(dict(TINY_GPT, dropout=0.1))
    cuda = cpu.replace(memory=cpu.memory.__class__(**{**cpu.memory.__dict__, "program": "cuda"}))
    assert activation_bytes(cuda).total < activation_bytes(cpu).total
