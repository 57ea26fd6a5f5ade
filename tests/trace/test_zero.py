"""DeepSpeed's ZeRO (the mixed-* modes, and fp32 where parallel.backend names it, with zero 1/2/3): DeepSpeed itself
on real gloo ranks, each rank measured with MemTracker, against the analytic model of its buckets, partitions and
flat optimizer step."""

import dataclasses

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory
from toolkit.trace.zero import deepspeed_config, trace_zero_ranks

LLAMA = {
    "preset": "llama2-7b",
    "layers": 4,
    "hidden": 256,
    "heads": 4,
    "kv_heads": 2,
    "ffn": 688,
    "seq_len": 256,
    "vocab": 4000,
}
GPT2 = {"preset": "gpt2-xl", "layers": 4, "hidden": 512, "heads": 8, "seq_len": 256, "vocab": 8000}


def zero_job(zero, m=1, dp=2, rec="none", bucket_mb=4.0, model=LLAMA, mode="mixed-bf16", **parallel):
    data = {
        "model": model,
        "batch": {"micro_batch": 2, "global_batch": 2 * dp * m},
        "precision": {"mode": mode},
        "parallel": {"zero": zero, "dp": dp, **parallel},
        "cluster": {"count": dp * parallel.get("tp", 1)},
        "memory": {"recompute": rec, "program": "cpu"},
        "training": {"bucket_cap_mb": bucket_mb},
    }
    return Job.from_dict(data).resolve()[0]


def assert_matches(job, traced, rel=0.02):
    est = memory_estimate(job)
    assert est.params_bytes == pytest.approx(traced.params_bytes, rel=0.01)
    assert est.grads_bytes == pytest.approx(traced.grads_bytes, rel=0.03)  # (DeepSpeed rounds partitions to
    assert est.optimizer_bytes == pytest.approx(traced.optimizer_bytes, rel=0.01)  # whole tensors)
    assert est.activations_bytes == pytest.approx(traced.activations_bytes, rel=0.03)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=rel)
    return est


def test_zero1_holds_whole_gradients_and_its_bucket_while_accumulating():
    """ZeRO-1 reduces only at the step's last micro-batch: until then every gradient is whole, beside the bucket
    its first backward made (the paper's 2 + 2 + 12/Nd bytes per parameter, and the bucket on top)."""
    job = zero_job(1, m=2, bucket_mb=25.0, model=GPT2)
    traced = trace_memory(job)
    assert traced.program.startswith("cpu, DeepSpeed") and "ZeRO-1" in traced.program
    est = assert_matches(job, traced, rel=0.01)  # (the 25 MB bucket is 8 % of this peak)
    assert est.peak_phase == "loss"
    assert traced.grads_bytes == pytest.approx(traced.params_bytes, rel=1e-3)  # whole, 16-bit like the weights


def test_zero2_peaks_reducing_its_last_bucket():
    """With full recompute and a bucket larger than the model, ZeRO-2 reduces once, at the backward's end: the
    bucket and its flattened copy are the peak. The traced program has two outcomes: in some traces (ci31, ci48,
    ci56, ci58, and both traces of ci68 on a loaded machine) a rank holds one more copy of the whole flattened 16-bit
    gradient at that peak (80,741,396 bytes against 75,790,868: exactly the gradients' 4,950,528). Pausing Python's
    collector through the step did not remove it, so its cause is not found; the estimate models the usual outcome,
    and the test accepts either, the other only as exactly that one copy more."""
    job = zero_job(2, rec="full", bucket_mb=25.0)
    traced = max(trace_zero_ranks(job), key=lambda r: r.peak_bytes)
    extra_copy = traced.peak_bytes - memory_estimate(job).peak_bytes > 0.5 * traced.grads_bytes
    usual = dataclasses.replace(traced, peak_bytes=traced.peak_bytes - traced.grads_bytes) if extra_copy else traced
    est = assert_matches(job, usual, rel=0.01)
    assert est.peak_phase == "gradient reduce"


@pytest.mark.parametrize("zero, offload", [(1, "none"), (3, "none"), (2, "optimizer")])
def test_deepspeed_in_fp32_keeps_fp32_weights_and_still_copies_its_partition(zero, offload):
    """parallel.backend deepspeed with fp32: DeepSpeed's engine without a bf16 section keeps fp32 weights (whole at
    ZeRO-1/2, where FSDP2 would shard them at 2) and, as in mixed precision, an fp32 copy of each rank's partition:
    16 bytes a parameter at ZeRO-1 on 2 ranks are 4 + 4 + (4 + 8) / 2, not torch's 4 + 4 + 8 / 2. Its buckets hold
    fp32 elements."""
    job = zero_job(zero, model=dict(LLAMA, layers=2), mode="fp32", backend="deepspeed", offload=offload)
    assert job.backend == "deepspeed" and "bf16" not in deepspeed_config(job)
    traced = trace_memory(job)
    assert traced.program.startswith("cpu, DeepSpeed")
    est = assert_matches(job, traced)
    assert est.host_bytes == pytest.approx(traced.host_bytes, rel=0.01)
    if zero == 1:
        params = traced.params_bytes / 4
        assert traced.optimizer_bytes == pytest.approx(params * (4 + 8) / 2, rel=0.01)  # the copy and m, v


def test_zero3_partitions_weights_and_keeps_its_gradient_buffers():
    """The activations a ZeRO-3 trace reports are the forward's growth less the gathered weights bound to their
    parameters at its end. The traced program has two outcomes: in one landing run of CI (stop 36, beside another
    test worker) the figure read exactly one 16-bit vocabulary matrix less (32,729,092 bytes against 34,777,092,
    which 18 traces here, 10 of them on a machine loaded by two busy loops, all gave). In the usual outcome the
    weights gathered at the forward's end are the head's and two of the top block's matrices (2,757,120 bytes,
    printed from DeepSpeed's ds_status at that moment; a third matrix is still in flight); in the other, one more
    vocabulary-sized storage counted as a weight. Which one, and why, is not found; the estimate models the
    usual outcome, and the test accepts either, the other only as exactly that matrix less."""
    job = zero_job(3, rec="selective", m=2)
    traced = trace_memory(job)
    head_bytes = job.model.vocab * job.model.hidden * 2
    if memory_estimate(job).activations_bytes - traced.activations_bytes > 0.5 * head_bytes:
        traced = dataclasses.replace(traced, activations_bytes=traced.activations_bytes + head_bytes)
    est = assert_matches(job, traced)
    assert est.params_bytes < traced.peak_bytes / 10  # weights partitioned over dp = 2


@pytest.mark.parametrize("zero, m", [(3, 2)])  # ZeRO-1 and 2 with offload: rows of benchmarks/memory_accuracy.py
def test_zero_offload_keeps_fp32_states_and_gradients_on_the_host(zero, m):
    """ZeRO-Offload: the host holds the fp32 partition and its gradient, the optimizer states, a 16-bit copy of the
    partition, a staging buffer the size of the largest tensor and (ZeRO-2 accumulating) the summed gradients,
    or (ZeRO-3) its 16-bit gradient partition; the device keeps the 16-bit weights, the same-sized staging buffer,
    the bucket, and (ZeRO-1 accumulating) its whole gradients until the last micro-batch."""
    job = zero_job(zero, m=m, bucket_mb=25.0, offload="optimizer")
    traced = trace_memory(job)
    assert "ZeRO-Offload" in traced.program and traced.grads_bytes == traced.optimizer_bytes == 0
    est = memory_estimate(job)
    assert est.host_bytes == pytest.approx(traced.host_bytes, rel=2e-3)
    assert est.params_bytes == pytest.approx(traced.params_bytes, rel=0.01)
    # (-2.4 % at ZeRO-2's top layer: a gradient the size of the head outlives its copy into the bucket, as
    # without offload, -1.7 %; not modelled yet)
    assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03), est.phases
    on_device = trace_memory(zero_job(zero, m=m, bucket_mb=25.0))
    assert traced.peak_bytes < on_device.peak_bytes - on_device.optimizer_bytes / 2


@pytest.mark.parametrize("layers, vocab, phase", [(8, 4000, "gradient reduce"), (4, 8000, "loss")])
def test_bf16_optimizer_keeps_fp32_gradients_and_casts_them_to_reduce(layers, vocab, phase):
    """DeepSpeed's BF16 optimizer (mixed-bf16, fp32 gradient accumulation, ZeRO-1): an fp32 gradient buffer of the
    whole model beside the bf16 gradients, master weights and moments sharded. After the last backward the engine
    all-reduces the buffers of its two parameter groups as one bucket: concatenated (fp32) and cast to bf16, 6
    bytes a parameter for a moment. Where the logits are small that moment is the peak (8 layers: 10 % over the
    model that lacked it; now within 0.01 %); with a larger vocabulary the loss is (the same program, 4 layers)."""
    model = {"layers": layers, "hidden": 256, "heads": 8, "vocab": vocab, "seq_len": 128}
    job = Job.from_dict(
        {
            "model": model,
            "batch": {"micro_batch": 2, "global_batch": 8},
            "precision": {"mode": "mixed-bf16", "grad_dtype": "fp32"},
            "parallel": {"zero": 1, "dp": 2, "backend": "deepspeed"},
            "cluster": {"count": 2},
            "memory": {"program": "cpu"},
        }
    ).resolve()[0]
    traced = trace_memory(job)
    assert "ZeRO-1" in traced.program
    est = assert_matches(job, traced)
    params = est.params_bytes / 2  # bf16 weights
    assert traced.grads_bytes == pytest.approx(6 * params, rel=0.01)  # bf16 gradients and the fp32 buffer
    assert est.peak_phase == phase


@pytest.mark.parametrize("impl", ["foreach", "for-loop"])
def test_zero2_keeps_its_gradient_partition_through_the_step(impl):
    """At the step ZeRO-2 casts a flat copy of its 16-bit gradient partition to fp32 and runs the optimizer on it,
    while the contiguous partition itself stays until the next backward: 2 bytes a parameter over dp that the
    model had left out where the step is the peak (a small vocabulary, recomputed blocks: 7.7 % under, beyond this
    file's 2 %; here within 0.01 %, and once 1.3 % over in CI beside a busy worker, cause not found)."""
    job = zero_job(2, rec="full", bucket_mb=25.0, model=dict(LLAMA, vocab=1000, hidden=512, ffn=1376, heads=8))
    job = job.replace(optimizer=dataclasses.replace(job.optimizer, impl=impl))
    est = assert_matches(job, trace_memory(job))
    assert est.peak_phase == "optimizer step"


def test_deepspeed_config_is_what_the_estimate_models():
    config = deepspeed_config(zero_job(3, bucket_mb=8.0))
    zero = config["zero_optimization"]
    assert zero["reduce_bucket_size"] == 4 * 2**20  # 8 MB of 16-bit elements
    assert config["bf16"] == {"enabled": True} and zero["stage3_max_reuse_distance"] == 0
    # one block: q and o 256 x 256, k and v 256 x 128 (2 kv heads of 64), gate, up and down 256 x 688, two norms
    assert zero["stage3_prefetch_bucket_size"] == 2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 688 + 2 * 256


def test_untraceable_deepspeed_layouts_are_refused_before_any_process_starts():
    with pytest.raises(SpecError, match="fp16 on GPUs only"):
        trace_memory(zero_job(2, mode="mixed-fp16"))
    with pytest.raises(SpecError, match="data-parallel ranks alone"):
        trace_memory(zero_job(2, tp=2))
    with pytest.raises(SpecError, match="not parameter offload"):
        trace_memory(zero_job(3, offload="params"))
