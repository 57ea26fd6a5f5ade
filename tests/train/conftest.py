"""A tiny job the runner trains in about a second, and helpers to run it in- or out-of-process."""

from __future__ import annotations

import copy

import pytest

from toolkit.checkpoint import latest_checkpoint
from toolkit.runs.folder import read_metrics
from toolkit.specs import Job
from toolkit.train.launch import prepare_run
from toolkit.train.loop import run_training

TINY = {
    "model": {"layers": 2, "hidden": 64, "heads": 4, "vocab": 256, "seq_len": 32},
    "batch": {"micro_batch": 2, "global_batch": 4},
    "precision": {"mode": "fp32"},
    "training": {"steps": 6, "warmup_steps": 1, "lr": 1e-3, "checkpoint_every": 0, "num_workers": 0},
}


def tiny_job(**sections) -> Job:
    data = copy.deepcopy(TINY)
    for section, values in sections.items():
        if isinstance(values, dict):
            data.setdefault(section, {}).update(values)
        else:
            data[section] = values
    return Job.from_dict(data)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    """The demo corpus, prepared once for the whole session."""
    from toolkit.train.data import ensure_demo_corpus

    return ensure_demo_corpus(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def train(tmp_path, corpus):
    """train(**sections) -> (metrics records, final checkpoint state): an in-process run of the tiny job."""

    def run(name="run", **sections):
        sections.setdefault("training", {})
        sections["training"] = {**sections["training"], "data": str(corpus)}
        job = prepare_run(tiny_job(**sections), tmp_path / name, 1)
        run_training(job, tmp_path / name, progress=False)
        state, _, _ = latest_checkpoint(tmp_path / name / "checkpoints")
        return read_metrics(tmp_path / name / "metrics.jsonl"), state

    return run
