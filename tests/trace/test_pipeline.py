"""Pipelines: torch's 1F1B and GPipe schedules run on real gloo ranks (one process per stage), each stage
measured with MemTracker, against the analytic model of the first and last stage."""
import pytest

from toolkit.estimate.memory import _stage_memory, memory_estimate
from toolkit.specs import Job, SpecError
from toolkit.trace.memory import trace_memory
from toolkit.trace.pipeline import trace_pipeline_stages

LLAMA = {"preset": "llama2-7b", "layers": 4, "hidden": 256, "heads": 4, "kv_heads": 2, "ffn": 688,
         "seq_len": 256, "vocab": 4000}


def pipeline_job(schedule, mode="amp-bf16", rec="none", m=4, pp=2, model=LLAMA):
    data = {"model": model, "batch": {"micro_batch": 2, "global_batch": 2 * m}, "precision": {"mode": mode},
            "parallel": {"pp": pp, "schedule": schedule}, "cluster": {"count": pp},
            "memory": {"recompute": rec, "program": "cpu"}}
    return Job.from_dict(data).resolve()[0]


@pytest.mark.parametrize("schedule, mode, rec", [("1f1b", "amp-bf16", "full"), ("gpipe", "pure-bf16", "none")])
def test_each_stage_matches_the_model(schedule, mode, rec):
    job = pipeline_job(schedule, mode, rec)
    first, last = trace_pipeline_stages(job)
    for traced, stage in ((first, "first"), (last, "last")):
        est = _stage_memory(job, stage)
        assert est.params_bytes == traced.params_bytes          # stage 0: embedding; last: norm and head
        assert est.grads_bytes == traced.grads_bytes
        assert est.peak_bytes == pytest.approx(traced.peak_bytes, rel=0.02)


def test_gpipe_holds_every_micro_batch_and_1f1b_at_most_pp():
    one_f_one_b, gpipe = (trace_pipeline_stages(pipeline_job(s, m=8)) for s in ("1f1b", "gpipe"))
    assert gpipe[0].peak_bytes > 1.5 * one_f_one_b[0].peak_bytes
    busiest = trace_memory(pipeline_job("gpipe", m=8))
    assert busiest.peak_bytes == max(s.peak_bytes for s in gpipe)
    assert memory_estimate(pipeline_job("gpipe", m=8)).peak_bytes == pytest.approx(busiest.peak_bytes, rel=0.01)


def test_untraceable_pipelines_are_refused_before_any_process_starts():
    with pytest.raises(SpecError, match="must divide model.layers"):
        trace_memory(pipeline_job("1f1b", pp=3, model=dict(LLAMA, layers=4)))
    with pytest.raises(SpecError, match="Megatron's pipeline program"):
        trace_memory(pipeline_job("1f1b", mode="mixed-bf16"))
    with pytest.raises(SpecError, match="allocates real memory"):
        trace_memory(pipeline_job("1f1b", model={"preset": "llama2-7b", "layers": 4}))
