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
from toolkit.specs import Job, load_catalog
from toolkit.train.metrics import read_metrics

SHAPE = {"layers": 4, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32}


@pytest.mark.parametrize("extra", [
    {"precision": {"mode": "fp32"}},
    {"precision": {"mode": "mixed-bf16"}},
    {"precision": {"mode": "amp-fp16"}},
    {"precision": {"mode": "amp-bf16"}, "finetune": {"method": "lora", "rank": 4}},
    {"precision": {"mode": "amp-bf16"}, "memory": {"act_compress": "int8"}},
    {"precision": {"mode": "pure-bf16"}, "training": {"fp32_norm": True}},
], ids=["fp32", "mixed-bf16", "amp-fp16", "lora", "int8", "fp32-norm"])
def test_the_planners_mask_agrees_with_the_runners_refusal_on_every_layout(extra):
    base, _ = Job.from_dict({"model": SHAPE, "batch": {"micro_batch": 1, "global_batch": 64},
                             "cluster": {"accelerator": "H100-SXM", "count": 8}, **extra}).resolve(load_catalog())
    grid = layout_grid(base, **{**{k: v for k, v in AXIS_VALUES.items() if k != "micro_batch"}, "cp": (1, 2)})
    mask = runnable_mask(grid.job)
    checked = runnable = 0
    for i in range(len(grid)):
        if not grid.valid[i]:
            continue
        lay = grid.layout(i)
        job = base.replace(parallel=dataclasses.replace(base.parallel, **{k: lay[k] for k in (
                               "dp", "tp", "pp", "vpp", "cp", "sp", "zero", "offload")}),
                           memory=dataclasses.replace(base.memory, recompute=lay["recompute"]))
        assert bool(mask[i]) == (run_refusal(job) is None), lay
        checked += 1
        runnable += bool(mask[i])
    # (adapters: the grid itself keeps replicas only, as resolve() does)
    assert checked > (5 if base.finetune.adapters else 300) and 0 < runnable <= checked


def test_a_runnable_plan_trains_as_written_on_four_ranks(tmp_path, corpus):
    job_file = tmp_path / "plan.yaml"
    toolkit = [sys.executable, "-m", "toolkit.cli"]
    assert main(["plan", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "256", "--seq", "32",
                 "--global-batch", "8", "--precision", "fp32", "--gpus", "4xH100-SXM", "--tokens", "1e6",
                 "--runnable", "--write-job", str(job_file)]) == 0
    written = Job.from_yaml(job_file)
    assert run_refusal(written.resolve(load_catalog())[0]) is None
    train = subprocess.run([*toolkit, "train", "--config", str(job_file), "--nproc", "4", "--steps", "3",
                            "--warmup", "1", "--num-workers", "0", "--no-progress", "--data", str(corpus),
                            "--out", str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert train.returncode == 0, train.stderr
    assert [r["step"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl")] == [1, 2, 3]
    trained = Job.from_yaml(tmp_path / "run" / "job.yaml").parallel
    assert (trained.tp, trained.zero, trained.offload) == (written.parallel.tp, written.parallel.zero,
                                                           written.parallel.offload)


def test_the_readme_renders_the_capability_table():
    """The README's table of what each backend estimates, traces and runs is the code's, not a copy that drifts."""
    from pathlib import Path

    from toolkit.capability import capability_markdown
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert capability_markdown() in readme
