"""`toolkit calibrate`: a profile of this machine that the catalog takes, and a run compared with the step-time
model on it. How close the model comes is benchmarks/steptime_accuracy.py's to say, on a quiet machine: beside
another test worker, two threads per op on two busy cores measure element-wise kernels 100x slower than alone."""
import pytest
import yaml

from toolkit.cli import main
from toolkit.estimate import estimate
from toolkit.estimate.steptime import hardware_for
from toolkit.specs import Job, load_catalog
from toolkit.trace.report import compare_run

SMALL = {"model": {"layers": 2, "hidden": 128, "heads": 4, "vocab": 256, "seq_len": 64},
         "batch": {"micro_batch": 2, "global_batch": 8}, "precision": {"mode": "fp32"},
         "training": {"steps": 8, "warmup_steps": 1, "num_workers": 0, "checkpoint_every": 0}}


def test_a_calibrated_profile_models_a_real_run(tmp_path, capsys):
    from toolkit.train.data import ensure_demo_corpus
    from toolkit.train.launch import prepare_run
    from toolkit.train.loop import run_training
    run, profile = tmp_path / "run", tmp_path / "profile.yaml"
    data = dict(SMALL, training=dict(SMALL["training"], data=str(ensure_demo_corpus(tmp_path / "cache"))))
    run_training(prepare_run(Job.from_dict(data), run, 1), run, progress=False)   # one rank, in this process
    assert main(["calibrate", "--config", str(run / "job.yaml"), "--out", str(profile)]) == 0
    assert "matmuls" in capsys.readouterr().out
    row = yaml.safe_load(profile.read_text())["accelerators"][0]
    assert row["source"].startswith("measured on ") and row["as_of"]
    catalog = load_catalog(profile)                  # a catalog row like any other, with its figures' source
    job, _ = Job.from_yaml(run / "job.yaml").resolve(catalog)
    hw = hardware_for(job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=1)), catalog)
    assert hw.assumptions.gemm_fraction == 1.0 and hw.assumptions.comm_overlaps_compute is False
    assert 1e6 < hw.peak_flops < 1e13 and hw.assumptions.op_overhead_s > 0, row     # (a loaded CPU measures low)
    step = compare_run(run, [profile], trace=False)["time"]["step_s"]
    modelled = estimate(job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=1)), catalog)
    assert step["measured"] > 0 and step["estimate"] == pytest.approx(modelled["time"]["step_s"]), (step, row)
    assert step["error"] == pytest.approx((step["estimate"] - step["measured"]) / step["measured"])


@pytest.mark.parametrize("argv, expect", [
    (["--nproc", "0", "--out", "p.yaml"], "--nproc = 0: must be 1 or more"),
    (["--out", "/no/such/folder/p.yaml"], "its folder /no/such/folder does not exist"),
    (["--config", "missing.yaml", "--out", "p.yaml"], "missing.yaml"),
])
def test_bad_calibrate_input_is_one_line(capsys, argv, expect):
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err


def test_a_tensor_parallel_job_calibrates_its_collectives_on_two_ranks(tmp_path):
    """On 2 gloo ranks a tp 2 job's profile carries the measured fixed cost of a tensor-parallel collective (the
    runner's DTensor layers around two real collectives), and the model prices the job's collectives with it."""
    import dataclasses

    from toolkit.calibrate import calibrate
    from toolkit.estimate.steptime import step_time
    job = Job.from_dict(dict(SMALL, parallel={"tp": 2}))
    profile = tmp_path / "profile.yaml"
    row = calibrate(job, 2, profile)["accelerators"][0]
    fixed_s = row["assumptions"]["tp_collective_s"]
    assert 1e-6 < fixed_s < 1.0 and row["link_bw_bytes_per_s"] > 0, row
    catalog = load_catalog(profile)
    placed, _ = job.replace(cluster=job.cluster.__class__(accelerator=row["name"], count=2)).resolve(catalog)
    hw = hardware_for(placed, catalog)
    slower = dataclasses.replace(hw.assumptions, tp_collective_s=2 * fixed_s)   # the measured figure is the one used
    assert step_time(placed, hw, slower).tp_comm_s > step_time(placed, hw).tp_comm_s > 0
