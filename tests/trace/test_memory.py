"""The fake-tensor tracer: full-size models on this machine, exact model states, clear refusals."""
import resource

import pytest

from toolkit.estimate.memory import memory_estimate
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory


def test_llama2_70b_traces_without_allocating():
    job, _ = Job.from_dict({"model": {"preset": "llama2-70b"}, "batch": {"micro_batch": 1, "global_batch": 1},
                            "precision": {"mode": "mixed-bf16"},
                            "memory": {"recompute": "full", "program": "cpu"},   # the program the tracer runs
                            "cluster": {"accelerator": "H100-SXM", "count": 1}}).resolve()
    traced = trace_memory(job)
    model = memory_estimate(job)
    assert traced.params_bytes == pytest.approx(2 * 68_976_648_192, rel=1e-4)       # bf16 weights (+ rope tables)
    assert traced.grads_bytes == 2 * 68_976_648_192
    assert traced.peak_bytes > 1e12                                                  # ~1.1 TB "used"...
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss < 4 * 2**20              # ...in under 4 GiB of RSS
    assert model.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)


@pytest.mark.parametrize("parallel, message", [
    ({"zero": 1}, "tracer covers data-parallel replicas, FSDP2"),     # ZeroRedundancyOptimizer: not yet
    ({"pp": 2}, "need untied embeddings and rotary positions"),
    ({"tp": 2, "zero": 2}, "tensor parallelism without ZeRO"),
    ({"tp": 2}, "needs untied embeddings"),                       # GPT-2 ties its embedding and head
])
def test_untraceable_layouts_are_refused(parallel, message):
    job, _ = Job.from_dict({"model": {"preset": "gpt2"}, "parallel": parallel,
                            "cluster": {"accelerator": "A100-80GB", "count": 4}}).resolve()
    with pytest.raises(SpecError, match=message):
        trace_memory(job)


def test_size_only_model_is_refused():
    job, _ = Job.from_dict({"model": {"params": 1e9}}).resolve()
    with pytest.raises(SpecError, match="give a shape"):
        trace_memory(job)


@pytest.mark.parametrize("mode, zero, rec", [("amp-bf16", 3, "none"), ("fp32", 3, "full"), ("pure-bf16", 2, "none")])
def test_fsdp2_on_a_fake_process_group(mode, zero, rec):
    """ZeRO-2/3 under torch semantics is FSDP2; one rank of 8 is traced without any other process."""
    model = {"preset": "llama2-7b", "layers": 3, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 688,
             "seq_len": 256, "vocab": 4000}
    job, _ = Job.from_dict({"model": model, "batch": {"micro_batch": 2, "global_batch": 16},
                            "precision": {"mode": mode}, "parallel": {"zero": zero},
                            "memory": {"recompute": rec, "program": "cpu"}, "cluster": {"count": 8}}).resolve()
    traced, model_mem = trace_memory(job), memory_estimate(job)
    assert traced.grads_bytes == pytest.approx(model_mem.grads_bytes, rel=1e-3)          # sharded 1/8
    assert traced.optimizer_bytes == pytest.approx(model_mem.optimizer_bytes, rel=1e-3)
    assert traced.activations_bytes == pytest.approx(model_mem.activations_bytes, rel=0.005)
    assert model_mem.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.03)
