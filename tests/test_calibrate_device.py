"""toolkit.calibrate.device: on a GPU host, calibrate measures what the device holds beyond the tensors by training
a few steps of the job's blocks. The measurement itself needs a GPU (benchmarks/gpu_check.sh runs it); here, what
a CPU can check: that a GPU is matched to its catalog row from the name and capacity nvidia-smi reports, and that
the probe is a job the runner trains on one device."""

import dataclasses
import json

import pytest

from toolkit.calibrate.device import PROBE_SHARE, PROBE_STEPS, _probe_peaks, catalog_row_for, probe_job
from toolkit.cli import main
from toolkit.estimate import estimate_result
from toolkit.specs import Job, load_catalog

MIB = 2**20


@pytest.mark.parametrize(
    "name, total_mib, row",
    [  # name and memory.total as nvidia-smi prints them
        ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM"),
        ("NVIDIA A100-SXM4-40GB", 40960, "A100-40GB"),
        ("NVIDIA A100-SXM4-80GB", 81920, "A100-80GB"),
        ("NVIDIA H200", 143771, "H200"),
        ("Tesla V100-SXM2-32GB", 32768, "V100-32GB"),
        ("NVIDIA GeForce RTX 4090", 24564, "RTX-4090"),
        ("AMD Instinct MI300X", 196592, "MI300X"),
        ("NVIDIA H100 PCIe", 81559, "H100-PCIe"),  # not its SXM sibling
        ("NVIDIA A10G", 23028, "A10G"),
        ("NVIDIA RTX A6000", 49140, None),  # not in the catalog (nor its RTX sibling, the 4090)
        ("NVIDIA L4", 23034, "L4"),
    ],
)
def test_a_gpu_is_its_catalog_row_by_the_name_and_capacity_nvidia_smi_reports(name, total_mib, row):
    assert catalog_row_for(name, total_mib * MIB, load_catalog()) == row


def test_the_probe_is_the_jobs_blocks_on_one_device_and_the_runner_trains_it(tmp_path, capsys):
    """A 176B job's probe is one tp rank's share of its blocks (heads, MLP and vocabulary over tp 4) at its
    micro-batch, precision and recompute on one H200, with as many layers as the estimate puts within half the
    device; a small job's probe goes through `toolkit train` for its
    steps (here on CPU, whose record is not the allocator's: refused in one line)."""
    bloom = {
        "model": {"layers": 70, "hidden": 14336, "heads": 112, "vocab": 250880, "seq_len": 2048},
        "batch": {"micro_batch": 2, "global_batch": 2048},
        "precision": {"mode": "mixed-bf16"},
        "parallel": {"dp": 8, "tp": 4, "pp": 12, "zero": 1},
        "memory": {"recompute": "full"},
        "cluster": {"accelerator": "H200", "count": 384},
    }
    job, _ = Job.from_dict(bloom).resolve()
    capacity = load_catalog().accelerator("H200").memory_bytes
    probe = probe_job(job, capacity)
    assert (probe.devices, probe.parallel.zero, probe.batch.micro_batch) == (1, 0, 2)
    assert (probe.model.hidden, probe.model.seq_len, probe.memory.recompute) == (14336, 2048, "full")
    assert (probe.model.heads, probe.model.ffn_, probe.model.vocab) == (28, 14336, 62720)
    assert 1 <= probe.model.layers < 70 and probe.precision.mode == "mixed-bf16"

    def peak(layers):
        deeper = probe.replace(model=dataclasses.replace(probe.model, layers=layers))
        return estimate_result(deeper).memory.device_peak_bytes

    assert peak(probe.model.layers) <= PROBE_SHARE * capacity < peak(probe.model.layers + 1)

    small, _ = Job.from_dict(
        {
            "model": {"layers": 3, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
            "batch": {"micro_batch": 2, "global_batch": 8},
            "precision": {"mode": "fp32"},
            "parallel": {"dp": 2, "zero": 3},
            "cluster": {"count": 2},
        }
    ).resolve()
    run = tmp_path / "probe" / "default"
    with pytest.raises(RuntimeError, match="ran on MemTracker .*, not a GPU"):
        _probe_peaks(probe_job(small, 2**30), run)
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == PROBE_STEPS and not list((run / "checkpoints").glob("step_*"))


def test_device_memory_alone_needs_a_gpu(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)  # (a host without one)
    assert main(["calibrate", "--gpu-only", "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "needs a CUDA GPU" in err, err
    assert not (tmp_path / "p.yaml").exists()
