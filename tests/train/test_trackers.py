"""training.trackers: TensorBoard, wandb (offline) and trackio runs write what metrics.jsonl holds, each read
back with its own reader (all three are in the test extra)."""

from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # (the test extra has it)

from toolkit.train.trackers import tracker_config

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


def _wandb_history(path: Path) -> list[dict]:
    """The history rows of a .wandb file, read with wandb's own protobuf: the file is a LevelDB-style log (7-byte
    header, 32 KiB blocks of records: checksum, length, kind FULL/FIRST/MIDDLE/LAST, data)."""
    import json

    from wandb.proto import wandb_internal_pb2

    buf, pos, chunks, pending = path.read_bytes(), 7, [], b""
    while pos + 7 <= len(buf):
        left = 32768 - pos % 32768
        length, kind = int.from_bytes(buf[pos + 4 : pos + 6], "little"), buf[pos + 6]
        if left < 7 or kind == 0:  # block trailer or padding
            pos += left
            continue
        chunk, pos = buf[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (1, 2):
            pending = chunk
        else:
            pending += chunk
        if kind in (1, 4):
            chunks.append(pending)
    rows = []
    for data in chunks:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


def test_wandb_logs_offline_into_the_run_folder_what_metrics_jsonl_holds(train, tmp_path, monkeypatch):
    """No login here: the run logs offline (wandb's login prompt would hang every rank) into the run folder,
    and wandb's own record of the run, read back, holds every step's loss."""
    for name in ("WANDB_API_KEY", "WANDB_MODE"):
        monkeypatch.delenv(name, raising=False)
    records, _ = train(name="wb", training={"trackers": ["wandb"], "steps": 3})
    logs = list(Path(tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 1, "no offline wandb run in the run folder"
    history = _wandb_history(logs[0])
    assert {r["_step"]: r["loss"] for r in history} == pytest.approx({r["step"]: r["loss"] for r in records}, rel=1e-6)


def test_trackio_logs_into_the_run_folder_what_metrics_jsonl_holds(train, tmp_path, monkeypatch):
    """trackio keeps its runs in a SQLite database; by default the runner puts it in OUT/trackio. Read back
    with sqlite3: every step's loss."""
    import json
    import os
    import sqlite3

    monkeypatch.delenv("TRACKIO_DIR", raising=False)
    try:
        records, _ = train(name="tio", training={"trackers": ["trackio"], "steps": 3})
    finally:
        os.environ.pop("TRACKIO_DIR", None)  # (the runner set it for this process)
    databases = list((tmp_path / "tio" / "trackio").glob("*.db"))
    assert databases, "no trackio database in the run folder"
    with sqlite3.connect(databases[0]) as db:
        rows = db.execute("SELECT step, metrics FROM metrics").fetchall()
    logged = {step: json.loads(metrics)["loss"] for step, metrics in rows if "loss" in json.loads(metrics)}
    assert logged == pytest.approx({r["step"]: r["loss"] for r in records}, rel=1e-6)
