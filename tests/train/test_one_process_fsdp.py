"""ZeRO-2/3 in one process is FSDP2 over a one-rank mesh: the runner runs it (it used to train a plain model while
the job said ZeRO), the tracer measures the same program, and the estimate models what one rank's FSDP2 does
(no block prefetched or gathered ahead: torch's FSDPParamGroup.unshard returns early over one rank and
wait_for_unshard copies each shard out; no collective for the reduce-scatter, so no gloo clone). With CPU offload
the device keeps no gradient: each block's shard goes to the host once reduce-scattered."""

import json

import pytest
import torch

from toolkit.estimate.memory import memory_estimate
from toolkit.runs.folder import memory_file
from toolkit.specs import Job
from toolkit.trace.memory import trace_memory

JOB = {
    "model": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 512, "seq_len": 128},
    "batch": {"micro_batch": 2, "global_batch": 2},
    "training": {"steps": 3, "warmup_steps": 1, "num_workers": 0, "checkpoint_every": 0},
}


@pytest.mark.parametrize(
    "zero, mode, offload", [(3, "fp32", "none"), (2, "amp-bf16", "none"), (3, "amp-bf16", "params")]
)
def test_zero_in_one_process_trains_under_fsdp2_as_traced_and_estimated(tmp_path, zero, mode, offload):
    from toolkit.train.data import ensure_demo_corpus
    from toolkit.train.launch import prepare_run
    from toolkit.train.loop import run_training

    run = tmp_path / "run"
    data = dict(
        JOB,
        precision={"mode": mode},
        parallel={"zero": zero, "offload": offload},
        training=dict(JOB["training"], data=str(ensure_demo_corpus(tmp_path / "cache"))),
    )
    job = Job.from_dict(data)
    run_training(prepare_run(job, run, 1), run, progress=False)
    assert not torch.distributed.is_initialized()  # the run's one-rank group is gone with it
    record = json.loads(memory_file(run, 0).read_text())
    assert record["categories"].get("SHARDED_PARAM", 0) > 0, record["categories"]  # FSDP2's, not a plain model
    resolved, _ = Job.from_yaml(run / "job.yaml").resolve()
    traced = trace_memory(resolved)
    assert record["peak_bytes"] == pytest.approx(traced.peak_bytes, rel=0.005)
    assert memory_estimate(resolved).peak_bytes == pytest.approx(record["peak_bytes"], rel=0.015)
