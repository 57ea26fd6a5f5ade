"""Calibrating from one measured step (`toolkit calibrate --step-s`): the profile keeps the accelerator's name, so
with `--catalog` the same job is estimated at the measured step, any other job on that accelerator is scaled alike
and says so, its band is the one run-calibrated steps hold, and bad input gets one line."""

import json

import pytest

from toolkit.cli.main import main

SAME = "--model llama3-8b --gpus 8xH100-SXM --global-batch 64 --seq 8192 --precision mixed-bf16".split()
OTHER = (
    "--model llama3-70b --gpus 64xH100-SXM --tp 8 --pp 2 --global-batch 256 --seq 4096 --precision mixed-bf16".split()
)


def _estimate(capsys, flags):
    capsys.readouterr()
    assert main(["estimate", *flags, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_one_measured_step_calibrates_every_job_on_that_accelerator(tmp_path, capsys):
    profile = tmp_path / "h100.yaml"
    assert main(["calibrate", *SAME, "--step-s", "9.5", "--out", str(profile)]) == 0
    assert "H100-SXM" in capsys.readouterr().out
    same = _estimate(capsys, [*SAME, "--catalog", str(profile)])
    assert same["time"]["step_s"] == pytest.approx(9.5, rel=1e-9)  # the run it was calibrated on, reproduced
    assert same["time"]["provenance"] == "calibrated" and same["time"]["step_s_regime"] == "run_calibrated"
    plain, scaled = _estimate(capsys, OTHER), _estimate(capsys, [*OTHER, "--catalog", str(profile)])
    ratio = 9.5 / _estimate(capsys, SAME)["time"]["step_s"]
    assert scaled["time"]["step_s"] == pytest.approx(plain["time"]["step_s"] * ratio, rel=1e-9)
    assert any("calibrated on your run" in n for n in scaled["notes"])
    assert plain["time"]["provenance"] == "modelled"


@pytest.mark.parametrize(
    ("flags", "words"),
    [(["--step-s", "-1"], "positive"), (["--measured", "no/such/run"], "not a run folder")],
)
def test_bad_measured_steps_get_one_line(tmp_path, capsys, flags, words):
    assert main(["calibrate", *SAME, *flags, "--out", str(tmp_path / "p.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and len(err.splitlines()) == 1
