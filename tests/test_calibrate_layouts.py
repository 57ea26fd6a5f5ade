"""Calibrating from two or more measured layouts (`toolkit calibrate --measured RUN --measured RUN`): a stack whose
matmuls run at one ratio to the model and whose collectives at another is recovered from runs whose steps lean on
the two differently, and a third layout on that accelerator is then priced with both; one layout alone, or layouts
that cannot tell them apart, keep one scale."""

import json

import pytest
import yaml

from toolkit.calibrate.run_scale import layouts_calibration_row
from toolkit.cli.main import main
from toolkit.estimate import estimate
from toolkit.estimate.steptime_result import COMMUNICATION_FIELDS
from toolkit.specs import Job, load_catalog

CATALOG = load_catalog()
STACK = {"compute": 1.15, "collectives": 1.8}
"""A stack 15 % slower than the model on matmuls and 80 % slower on collectives (e.g. NCCL over a slower fabric)."""


def _job(spec: dict) -> Job:
    base = {"cluster": {"accelerator": "H100-SXM", "count": 16}, "precision": {"mode": "mixed-bf16"},
            "batch": {"global_batch": 64}}  # fmt: skip
    return Job.from_dict(base | spec, CATALOG).resolve(CATALOG)[0]


LAYOUTS = [
    {"model": {"preset": "llama3-8b", "seq_len": 4096}},
    {"model": {"preset": "llama3-70b", "seq_len": 4096}, "parallel": {"tp": 8, "pp": 2}},
    {"model": {"preset": "llama3-70b", "seq_len": 4096}, "parallel": {"tp": 4, "pp": 4}},
]


def _step_on_the_stack(job: Job) -> float:
    parts = estimate(job, CATALOG)["time"]["breakdown"]
    comm = sum(v for k, v in parts.items() if k in COMMUNICATION_FIELDS)
    return STACK["compute"] * (sum(parts.values()) - comm) + STACK["collectives"] * comm


def test_two_layouts_recover_both_scales_and_price_a_third(tmp_path, capsys):
    runs = []
    for i, spec in enumerate(LAYOUTS[:2]):  # two toolkit run folders with their measured steps
        folder = tmp_path / f"run{i}"
        folder.mkdir()
        job = _job(spec)
        job.to_yaml(folder / "job.yaml")
        step = _step_on_the_stack(job)
        (folder / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "time_s": step}) + "\n" for s in range(8)))
        runs.append(str(folder))
    profile = tmp_path / "h100.yaml"
    assert main(["calibrate", "--measured", runs[0], "--measured", runs[1], "--out", str(profile)]) == 0
    cal = yaml.safe_load(profile.read_text())["accelerators"][0]["step_calibration"]
    assert cal["scale"] == pytest.approx(STACK["compute"], rel=1e-3)
    assert cal["communication_scale"] == pytest.approx(STACK["collectives"], rel=1e-3)
    third = _job(LAYOUTS[2])
    capsys.readouterr()
    catalog = load_catalog(str(profile))
    priced = estimate(third, catalog)["time"]
    assert priced["step_s"] == pytest.approx(_step_on_the_stack(third), rel=1e-6)
    assert priced["provenance"] == "calibrated"


def test_layouts_that_cannot_tell_the_scales_apart_keep_one():
    job = _job(LAYOUTS[0])
    row = layouts_calibration_row([(job, 2.0), (job, 2.0)], CATALOG)["step_calibration"]
    assert row["scale"] == row["communication_scale"]
