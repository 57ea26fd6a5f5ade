"""One table says what the runner trains (toolkit.capability): the planner's vectorised mask and the runner's
refusal agree on every layout, and a plan made with --runnable trains as written."""

import dataclasses
import subprocess
import sys

import pytest

from toolkit.capability import run_refusal, runnable_mask
from toolkit.cli import main
from toolkit.estimate.grid import layout_grid
from toolkit.plan.search import AXIS_VALUES
from toolkit.runs.folder import read_metrics, run_catalog_files
from toolkit.specs import Job, load_catalog

SHAPE = {"layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}


@pytest.mark.parametrize(
    "extra",
    [
        {"precision": {"mode": "fp32"}},
        {"precision": {"mode": "mixed-bf16"}},
        {"precision": {"mode": "amp-fp16"}},
        {"precision": {"mode": "amp-bf16"}, "finetune": {"method": "lora", "rank": 4}},
        {"precision": {"mode": "amp-bf16"}, "memory": {"act_compress": "int8"}},
        {"precision": {"mode": "pure-bf16"}, "training": {"fp32_norm": True}},
    ],
    ids=["fp32", "mixed-bf16", "amp-fp16", "lora", "int8", "fp32-norm"],
)
def test_the_planners_mask_agrees_with_the_runners_refusal_on_every_layout(extra):
    base, _ = Job.from_dict(
        {
            "model": SHAPE,
            "batch": {"micro_batch": 1, "global_batch": 64},
            "cluster": {"accelerator": "H100-SXM", "count": 8},
            **extra,
        }
    ).resolve(load_catalog())
    grid = layout_grid(base, **{**{k: v for k, v in AXIS_VALUES.items() if k != "micro_batch"}, "cp": (1, 2)})
    mask = runnable_mask(grid.job)
    checked = runnable = 0
    for i in range(len(grid)):
        if not grid.valid[i]:
            continue
        lay = grid.layout(i)
        job = base.replace(
            parallel=dataclasses.replace(
                base.parallel, **{k: lay[k] for k in ("dp", "tp", "pp", "vpp", "cp", "sp", "zero", "offload")}
            ),
            memory=dataclasses.replace(base.memory, recompute=lay["recompute"]),
        )
        assert bool(mask[i]) == (run_refusal(job) is None), lay
        checked += 1
        runnable += bool(mask[i])
    # (adapters: the grid itself keeps replicas only, as resolve() does)
    assert checked > (5 if base.finetune.adapters else 300) and 0 < runnable <= checked


@pytest.mark.alone
def test_a_plan_for_this_machine_trains_as_written_on_four_ranks(tmp_path, corpus):
    """This machine as a catalog row (toolkit calibrate on 4 busy ranks), the planner's best runnable layout on 4 of
    its CPU 'devices', and that plan trained as written: the run resolves the row from its own folder, and its MFU is
    against the measured peak."""
    import yaml

    profile, job_file, run = tmp_path / "profile.yaml", tmp_path / "plan.yaml", tmp_path / "run"
    shape = ["--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "32", "--precision", "fp32"]
    (tmp_path / "small.yaml").write_text(
        yaml.safe_dump(
            {
                "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
                "batch": {"micro_batch": 2, "global_batch": 8},
                "precision": {"mode": "fp32"},
            }
        )
    )
    assert main(["calibrate", "--nproc", "4", "--config", str(tmp_path / "small.yaml"), "--out", str(profile)]) == 0
    row = yaml.safe_load(profile.read_text())["accelerators"][0]
    assert row["device_memory"]["context_bytes"] > 100 * 2**20  # the process itself, not a CUDA context
    assert (
        main(
            [
                "plan",
                *shape,
                "--global-batch",
                "8",
                "--catalog",
                str(profile),
                "--gpus",
                f"4x{row['name']}",
                "--tokens",
                "1e6",
                "--runnable",
                "--write-job",
                str(job_file),
            ]
        )
        == 0
    )
    written = Job.from_yaml(job_file, load_catalog(profile))
    assert written.cluster.accelerator == row["name"]
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "train",
            "--config",
            str(job_file),
            "--catalog",
            str(profile),
            "--nproc",
            "4",
            "--steps",
            "3",
            "--warmup",
            "1",
            "--num-workers",
            "0",
            "--no-progress",
            "--data",
            str(corpus),
            "--out",
            str(run),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert train.returncode == 0, train.stderr
    records = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in records] == [1, 2, 3] and all(0 < r["mfu"] < 1 for r in records[1:]), records
    trained = Job.from_yaml(run / "job.yaml", load_catalog(*run_catalog_files(run))).parallel
    assert (trained.dp, trained.tp, trained.pp, trained.zero) == (
        written.parallel.dp,
        written.parallel.tp,
        written.parallel.pp,
        written.parallel.zero,
    )
    assert main(["compare", "--run", str(run), "--no-trace", "--json"]) == 0  # (no --catalog: the run's own)
    again = subprocess.run(
        [
            sys.executable,
            "-m",
            "toolkit.cli",
            "train",
            "--config",
            str(run / "job.yaml"),
            "--nproc",
            "4",
            "--steps",
            "4",
            "--no-progress",
            "--out",
            str(run),
        ],  # a rerun, no --catalog
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0 and "resumed from step_00000003.pt" in again.stdout + again.stderr, again.stderr


def test_the_readme_renders_the_capability_table():
    """The capability table (docs/troubleshoot.md, linked from the README) of what each backend estimates, traces
    and runs is the code's, not a copy that drifts."""
    from pathlib import Path

    from toolkit.capability import capability_markdown

    readme = (Path(__file__).parents[2] / "docs" / "troubleshoot.md").read_text()
    assert capability_markdown() in readme
