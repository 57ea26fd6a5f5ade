"""training.trackers: a TensorBoard run writes what metrics.jsonl holds, read back with TensorBoard's own reader."""
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator   # (the test extra has it)

from toolkit.train.loop import tracker_config

from .conftest import tiny_job


def test_tensorboard_reads_back_every_step_of_the_run(train, tmp_path):
    records, _ = train(name="tb", training={"trackers": ["tensorboard"], "steps": 4})
    events = list(Path(tmp_path / "tb").rglob("events.out.tfevents.*"))
    assert events, "no TensorBoard event file in the run folder"
    scalars = EventAccumulator(str(events[0].parent)).Reload()
    losses = {e.step: e.value for e in scalars.Scalars("loss")}
    assert losses == pytest.approx({r["step"]: r["loss"] for r in records}, rel=1e-6)
    assert "tokens_per_s" in scalars.Tags()["scalars"]


def test_tracker_config_is_flat_scalars():
    flat = tracker_config(tiny_job(training={"trackers": ["tensorboard"]}))
    assert flat["model.hidden"] == 64 and flat["precision.mode"] == "fp32"
    assert all(isinstance(v, (bool, int, float, str)) for v in flat.values())
