"""Tensor and sequence parallelism: one rank of torch's DTensor program, traced on a fake process group,
against the analytic model (states, saved activations, the peak)."""

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory

LLAMA = {
    "preset": "llama2-7b",
    "layers": 2,
    "hidden": 256,
    "heads": 8,
    "kv_heads": 4,
    "ffn": 688,
    "seq_len": 256,
    "vocab": 4000,
}
GPT = {
    "preset": "gpt2",
    "layers": 2,
    "hidden": 256,
    "heads": 8,
    "seq_len": 256,
    "max_positions": 256,
    "vocab": 4001,
    "tie_embeddings": False,
}  # an odd vocabulary: uneven shards


def traced_job(model, tp, sp=False, mode="amp-bf16", rec="none", att="flash", b=2, accum=1, dp=1, zero=0):
    data = {
        "model": model,
        "batch": {"micro_batch": b, "global_batch": b * accum * dp},
        "precision": {"mode": mode},
        "parallel": {"tp": tp, "sp": sp, "zero": zero},
        "cluster": {"count": tp * dp},
        "memory": {"recompute": rec, "attention": att, "program": "cpu"},
    }
    return Job.from_dict(data).resolve()[0]


@pytest.mark.parametrize(
    "model, tp, sp, mode, rec, att",
    [
        (LLAMA, 2, False, "amp-bf16", "none", "flash"),
        (LLAMA, 2, True, "amp-fp16", "selective", "eager"),
        (LLAMA, 4, True, "pure-bf16", "full", "flash"),
        (LLAMA, 2, True, "amp-bf16", "selective-op", "flash"),
        (GPT, 2, False, "fp32", "none", "eager"),
    ],
)
def test_tensor_parallel_rank_matches_the_model(model, tp, sp, mode, rec, att):
    job = traced_job(model, tp, sp, mode, rec, att)
    traced, est = trace_memory(job), memory_estimate(job)
    # states: sharded matrices and vocabulary, replicated norms and row biases, the rope tables
    assert est.params_bytes == traced.params_bytes
    assert est.grads_bytes == traced.grads_bytes
    assert est.optimizer_bytes == pytest.approx(traced.optimizer_bytes, abs=1024)  # + Adam's step counters
    assert est.activations_bytes == pytest.approx(traced.activations_bytes, rel=1e-4)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.01)


def test_megatron_semantics_are_not_traced():
    """mixed-* modes follow Megatron's program (sharded norm outputs under sp, fused vocab-parallel loss)."""
    from toolkit.specs import SpecError

    with pytest.raises(SpecError, match="Megatron's tensor-parallel program"):
        trace_memory(traced_job(LLAMA, 2, sp=True, mode="mixed-bf16"))
    torch_program = memory_estimate(traced_job(LLAMA, 2, sp=True, mode="pure-bf16"))
    megatron = memory_estimate(traced_job(LLAMA, 2, sp=True, mode="mixed-bf16"))
    assert megatron.activations_bytes < torch_program.activations_bytes


def test_tensor_parallelism_divides_the_rank_and_sequence_parallelism_divides_more():
    one, two = trace_memory(traced_job(LLAMA, 1)), trace_memory(traced_job(LLAMA, 2))
    two_sp = trace_memory(traced_job(LLAMA, 2, sp=True))
    assert 0.45 < two.activations_bytes / one.activations_bytes < 0.7  # norms and the residual stay whole
    assert two_sp.activations_bytes < two.activations_bytes
    assert two.params_bytes < 0.51 * one.params_bytes


@pytest.mark.parametrize(
    "model, zero, sp, mode, rec",
    [
        (LLAMA, 3, True, "amp-bf16", "none"),
        (dict(LLAMA, vocab=1000), 2, True, "amp-bf16", "full"),  # small vocabulary: the peak is in backward
        (dict(LLAMA, vocab=1000), 3, False, "pure-bf16", "full"),
    ],
)
def test_tensor_parallelism_inside_fsdp2(model, zero, sp, mode, rec):
    """torchtitan's 2-D layout: the DTensor plan over tp, FSDP2 over dp, one rank of a 4 x 2 fake mesh."""
    job = traced_job(model, 2, sp, mode, rec, b=4, dp=4, zero=zero)
    traced, est = trace_memory(job), memory_estimate(job)
    alone = trace_memory(traced_job(model, 2, sp, mode, rec, b=4))
    assert traced.params_bytes < 0.3 * alone.params_bytes  # sharded over dp too (norms, rope stay)
    assert est.params_bytes == traced.params_bytes
    assert est.grads_bytes == traced.grads_bytes
    assert est.optimizer_bytes == pytest.approx(traced.optimizer_bytes, abs=1024)
    assert est.activations_bytes == pytest.approx(traced.activations_bytes, rel=0.005)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.02)
