"""`toolkit calibrate`: a profile of this machine that the catalog takes, and the step-time model with it against a
real run's measured step (the 15 % target is benchmarks/steptime_accuracy.py's, on a quiet machine; here the suite
runs beside other tests, so the bound is loose but still catches a model off by a unit or a missing part)."""
import pytest
import yaml

from toolkit.cli import main
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
    assert 1e9 < hw.peak_flops < 1e13 and hw.assumptions.op_overhead_s > 0
    step = compare_run(run, [profile])["time"]["step_s"]
    assert step["measured"] > 0 and 0.5 < step["estimate"] / step["measured"] < 2.0, step


@pytest.mark.parametrize("argv, expect", [
    (["--nproc", "0", "--out", "p.yaml"], "--nproc = 0: must be 1 or more"),
    (["--out", "/no/such/folder/p.yaml"], "its folder /no/such/folder does not exist"),
    (["--config", "missing.yaml", "--out", "p.yaml"], "missing.yaml"),
])
def test_bad_calibrate_input_is_one_line(capsys, argv, expect):
    assert main(["calibrate", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and expect in err, err
