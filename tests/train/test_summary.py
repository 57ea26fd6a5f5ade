"""The run summary `toolkit train` prints at the end: on a GPU it sets the allocator's reserved peak and what the
device shows in use beside the estimate's reserved and device-visible peaks (issue 19's per-rank record)."""

import json

import pytest
import torch

from toolkit.estimate.report import estimate
from toolkit.runs.folder import memory_file, write_rank_memory
from toolkit.specs import Job
from toolkit.train.memory_record import MemoryRecorder
from toolkit.train.summary import render_run_summary, run_summary
from toolkit.views.text import gib

GIB = 2**30
SMALL = {
    "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
    "batch": {"micro_batch": 2, "global_batch": 2},
    "precision": {"mode": "fp32"},
    "training": {"steps": 3, "warmup_steps": 1, "num_workers": 0, "checkpoint_every": 0},
    "cluster": {"accelerator": "H200", "count": 1},
}  # (trained here on the CPU; estimated as on an H200)


def test_a_gpu_ranks_reserved_and_device_peaks_reach_the_summary_beside_the_estimates(tmp_path, monkeypatch):
    from toolkit.train.data import ensure_demo_corpus
    from toolkit.train.launch import prepare_run
    from toolkit.train.loop import run_training

    run = tmp_path / "run"
    data = dict(SMALL, training=dict(SMALL["training"], data=str(ensure_demo_corpus(tmp_path / "cache"))))
    job = Job.from_dict(data)
    run_training(prepare_run(job, run, 1), run, progress=False)
    assert "device/rank" not in render_run_summary(run)  # a CPU run records tensors, not a device
    # what a CUDA rank's recorder reads from torch.cuda at its recorded step's end (this machine has no GPU)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 3 * GIB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 4 * GIB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (70 * GIB, 75 * GIB))
    recorder = MemoryRecorder(None, job, torch.device("cuda", 0), 0, run, 0, 3)
    recorder.steps = [0, 1]
    recorder.end_step(1)
    record = json.loads(memory_file(run, 0).read_text())
    assert (record["peak_bytes"], record["reserved_peak_bytes"], record["device_peak_bytes"]) == (
        3 * GIB,
        4 * GIB,
        5 * GIB,
    )
    write_rank_memory(run, dict(record, rank=1, reserved_peak_bytes=6 * GIB, device_peak_bytes=7 * GIB))
    summary = run_summary(run)
    resolved, _ = Job.from_yaml(run / "job.yaml").resolve()
    est = estimate(resolved)["memory"]
    assert summary["reserved_peak_bytes"] == 6 * GIB and summary["device_peak_bytes"] == 7 * GIB  # busiest rank
    assert summary["estimated_device_peak_bytes"] == pytest.approx(est["device_peak_bytes"])
    assert summary["estimated_device_peak_bytes"] > summary["estimated_reserved_peak_bytes"] > est["peak_bytes"]
    line = next(x for x in render_run_summary(run).splitlines() if "device/rank" in x)
    assert "reserved 6.0 GiB" in line and "device 7.0 GiB" in line and gib(est["device_peak_bytes"]) in line, line
