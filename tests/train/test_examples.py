"""examples/: each Job file loads and is estimated as its comment says; tiny.yaml trains on this CPU."""

import dataclasses
from pathlib import Path

import pytest

from toolkit.checkpoint import latest_checkpoint
from toolkit.estimate import estimate
from toolkit.runs.folder import read_metrics
from toolkit.specs import Job
from toolkit.train.launch import prepare_run
from toolkit.train.loop import run_training

EXAMPLES = Path(__file__).parents[2] / "examples"


def load(name: str) -> Job:
    return Job.from_yaml(EXAMPLES / f"{name}.yaml")


def test_every_example_is_tested():
    assert sorted(p.stem for p in EXAMPLES.glob("*.yaml")) == sorted(
        ["tiny", "gpt2-small", "llama2-7b-lora-rtx4090", "gpt3-175b-a100"]
    )


def test_gpt3_example_is_the_published_budget():
    result = estimate(load("gpt3-175b-a100"))
    assert result["compute"]["pf_days_6nd"] == pytest.approx(3640, rel=0.01)  # Brown et al. 2020, Table D.1
    assert result["memory"]["fits"] and result["cost"]["instances"] == 128  # 8 A100s per p4de


def test_llama_lora_fits_a_4090_where_full_finetuning_does_not():
    job = load("llama2-7b-lora-rtx4090")
    lora = estimate(job)["memory"]
    full = estimate(job.replace(finetune=Job().finetune))["memory"]
    assert lora["device_bytes"] == 24 * 2**30 and lora["fits"] and not full["fits"]
    assert full["params_bytes"] > 13e9  # 6.74 B bf16 weights alone


def test_gpt2_example_is_gpt2_small():
    result = estimate(load("gpt2-small"))
    assert result["model"]["params"] == 124_439_808  # Hugging Face gpt2, num_parameters()
    assert result["memory"]["fits"] and result["job"]["batch"]["global_batch"] == 480


def test_tiny_example_trains_here_and_leaves_the_layout_to_the_launcher(tmp_path, corpus):
    job = load("tiny")
    assert job.parallel.dp is None and job.cluster.count is None  # 1, 2 or 4 ranks alike
    assert job.precision.mode == "fp32" and job.model.dropout == 0
    assert all(job.batch.global_batch % (job.batch.micro_batch * n) == 0 for n in (1, 2, 4))
    job = job.replace(training=dataclasses.replace(job.training, data=str(corpus)))
    prepared = prepare_run(job, tmp_path / "run", 1)
    run_training(prepared, tmp_path / "run", progress=False)
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records] == list(range(1, job.training.steps + 1))
    assert records[-1]["loss"] < records[0]["loss"]
    assert latest_checkpoint(tmp_path / "run" / "checkpoints")[0] is not None
