"""The tracer runs the runner's program and step (toolkit.program.step): a run's own measurement of its tensors
(MemTracker over the real run, memory/rank0.json) and the trace on fake tensors see the same step."""

import pytest

from toolkit.runs.folder import read_rank_memory
from toolkit.trace.memory import trace_memory
from toolkit.train.launch import prepare_run
from toolkit.train.loop import run_training

from .conftest import tiny_job


@pytest.mark.parametrize(
    "sections",
    [
        {"precision": {"mode": "mixed-bf16"}},  # master weights: 16-bit grads moved at the step
        {"precision": {"mode": "amp-bf16"}, "memory": {"recompute": "full"}, "batch": {"global_batch": 8}},
    ],
    ids=["mixed-bf16", "amp-bf16-full-recompute-accumulating"],
)
def test_the_trace_measures_the_step_the_run_measured(tmp_path, corpus, sections):
    sections = {**sections, "training": {"steps": 3, "data": str(corpus)}}
    job = prepare_run(tiny_job(**sections), tmp_path, 1)
    run_training(job, tmp_path, progress=False)
    [run] = read_rank_memory(tmp_path)
    traced = trace_memory(job.resolve()[0])
    assert run["states"]["grads_bytes"] == traced.grads_bytes > 0  # the gradients the last backward left
    assert run["states"]["params_bytes"] == traced.params_bytes
    assert run["peak_bytes"] == traced.peak_bytes  # byte for byte: one program
