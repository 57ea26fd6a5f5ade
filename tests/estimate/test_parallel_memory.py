"""Activations and transients under tensor, sequence and pipeline parallelism and ZeRO (analytic)."""

import pytest

from toolkit.estimate.activations import activation_bytes, pipeline_in_flight
from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job

GPT = {"preset": "gpt2", "layers": 8, "hidden": 1024, "heads": 16, "seq_len": 1024, "max_positions": 1024}


def job(parallel=None, count=None, mode="fp32", b=2, accum=1, model=GPT, rec="none") -> Job:
    parallel = parallel or {}
    count = count or parallel.get("tp", 1) * parallel.get("pp", 1) * parallel.get("dp", 1)
    data = {
        "model": model,
        "precision": {"mode": mode},
        "parallel": parallel,
        "batch": {"micro_batch": b, "global_batch": b * accum * parallel.get("dp", 1)},
        "memory": {"recompute": rec, "program": "cuda"},
        "cluster": {"count": count},
    }
    return Job.from_dict(data).resolve()[0]


def test_tensor_parallel_splits_heads_and_mlp_not_the_residual_stream():
    """Korthikanti et al. (2022): with tp, everything but the h-wide tensors is divided by t."""
    t = 4
    one, split = activation_bytes(job()).per_layer, activation_bytes(job({"tp": t})).per_layer
    tokens, h = 2 * 1024, 1024
    replicated = 2 * (tokens * h * 4 + 2 * tokens * 4 + tokens * h * 4)  # two LayerNorms: input, stats, output
    assert split == pytest.approx(replicated + (one - replicated) / t)


def test_sequence_parallel_divides_all_but_the_gathered_linear_inputs():
    """Korthikanti et al. (2022) divide every tensor by t; torch's linears keep their all-gathered input
    (the norms' outputs, one fp32 copy each for q/k/v and for up), so those stay whole."""
    tokens, h = 2 * 1024, 1024
    gathered = 2 * tokens * h * 4
    for t in (2, 4, 8):
        split = activation_bytes(job({"tp": t, "sp": True})).per_layer
        assert split == pytest.approx((activation_bytes(job()).per_layer - gathered) / t + gathered)


def test_vocab_parallel_logits():
    one, split = activation_bytes(job()), activation_bytes(job({"tp": 4}))
    assert one.head - split.head == pytest.approx((50257 - 12565) * 2 * 1024 * 4)  # the busiest rank: ceil(V / 4)


@pytest.mark.parametrize(
    "schedule, pp, vpp, m, expected",
    [
        ("gpipe", 4, 1, 16, 16),
        ("1f1b", 4, 1, 16, 4),
        ("1f1b", 4, 1, 2, 2),
        ("1f1b", 4, 2, 16, 4 * (1 + 3 / 8)),
        ("1f1b", 1, 1, 16, 1),
    ],
)
def test_pipeline_in_flight(schedule, pp, vpp, m, expected):
    j = job({"pp": pp, "vpp": vpp, "schedule": schedule}, accum=m)
    assert pipeline_in_flight(j) == pytest.approx(expected)


def test_first_stage_holds_in_flight_micro_batches():
    j = job({"pp": 4}, accum=8)
    first, last = activation_bytes(j, "first"), activation_bytes(j, "last")
    stream = 2 * 1024 * 1024 * 4  # one micro-batch's residual stream: the output a stage sent on
    # 8 layers / 4 stages, 4 micro-batches in flight, each keeping its output; 1F1B's 8 receive buffers
    assert first.layers == (first.per_layer * 2 + stream) * 4 + 8 * stream
    assert last.layers == last.per_layer * 2 + 8 * stream and first.head == 0 < last.head
    assert activation_bytes(j).total == max(first.total, last.total)


def test_zero3_gathers_a_layer_and_its_prefetch():
    """DeepSpeed's ZeRO-3 keeps two blocks' worth of parameters gathered (current + prefetched), the head alone
    when that is larger, and its gradient partition and reduce bucket from start-up on (ZeRO-2 makes them
    during backward)."""
    per_layer = 12 * 1024 * 1024 + 13 * 1024  # GPT-2 block parameters at h = 1024
    bucket = 25 * 2**20  # training.bucket_cap_mb's default
    for vocab, gathered in ((50257, 50257 * 1024), (8000, 2 * per_layer)):  # the tied head, or two blocks
        z2 = memory_estimate(job({"dp": 8, "zero": 2}, mode="mixed-bf16", model=dict(GPT, vocab=vocab)))
        z3 = memory_estimate(job({"dp": 8, "zero": 3}, mode="mixed-bf16", model=dict(GPT, vocab=vocab)))
        assert z2.phases["loss"] - z3.phases["loss"] == pytest.approx(
            (z2.params_bytes - z3.params_bytes) - gathered * 2 - z3.grads_bytes - bucket
        )


def test_fsdp_zero2_keeps_unsharded_weights_until_backward():
    z1 = memory_estimate(job({"dp": 8, "zero": 1}, mode="amp-bf16"))
    z2 = memory_estimate(job({"dp": 8, "zero": 2}, mode="amp-bf16"))
    per_layer = 12 * 1024 * 1024 + 13 * 1024
    root = 50257 * 1024 + 1024 * 1024 + 2 * 1024  # embeddings and final norm
    # FSDP2 gathers 16-bit weights (no separate autocast casts): the root and all 8 blocks held at the loss
    assert z2.activations_bytes < z1.activations_bytes
    assert z2.phases["loss"] - z2.activations_bytes - z2.params_bytes - z2.optimizer_bytes == pytest.approx(
        (8 * per_layer + root) * 2 + 2 * 2 * 1024 * 50257 * 4
    )


def test_offload_moves_the_step_off_the_device():
    j = job({"dp": 8, "zero": 3, "offload": "params"}, mode="amp-bf16")
    mem = memory_estimate(j)
    assert mem.params_bytes == mem.grads_bytes == mem.optimizer_bytes == 0 and mem.host_bytes > 0
    assert mem.phases["optimizer step"] == 0


def test_fp8_all_gather_gathers_the_blocks_linear_weights_in_one_byte():
    """torchao's enable_fsdp_float8_all_gather: FSDP2 gathers each nn.Linear weight of a block as float8, the rest
    (norms, the root) in bf16. The linear weights are counted on the runner's own block, not by formula."""
    import torch

    from toolkit.program.model import Block
    from toolkit.specs import SpecError
    from toolkit.specs.job import ModelSpec

    shape = {
        "layers": 8,
        "hidden": 1024,
        "heads": 16,
        "kv_heads": 4,
        "ffn": 2816,
        "vocab": 32000,
        "seq_len": 1024,
        "mlp": "swiglu",
        "norm": "rmsnorm",
        "position": "rope",
    }
    with torch.device("meta"):
        block = Block(ModelSpec(**shape), "flash", False)
    linear = sum(m.weight.numel() for m in block.modules() if isinstance(m, torch.nn.Linear))

    def fp8(gather, parallel=None):
        data = {
            "model": shape,
            "precision": {"mode": "amp-bf16", "fp8": True, "fp8_all_gather": gather},
            "parallel": parallel or {"dp": 8, "zero": 2},
            "batch": {"micro_batch": 2, "global_batch": 16},
            "memory": {"program": "cuda"},
            "cluster": {"accelerator": "H100-SXM", "count": 8},
        }
        return Job.from_dict(data).resolve()[0]

    bf16, float8 = memory_estimate(fp8(False)), memory_estimate(fp8(True))
    assert bf16.phases["loss"] - float8.phases["loss"] == pytest.approx(8 * linear * (2 - 1))  # all 8 gathered
    with pytest.raises(SpecError, match="fp8_all_gather"):
        fp8(True, {"dp": 8, "zero": 1})
