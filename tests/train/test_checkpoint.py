"""Checkpoints: the newest valid one loads; an interrupted or damaged one is reported and skipped."""

import torch

from toolkit.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint


def _save(folder, step, keep=5):
    return save_checkpoint(folder, step, {"step": step, "w": torch.full((4,), float(step))}, keep)


def test_round_trip_and_keep_only_the_newest(tmp_path):
    for step in (1, 2, 3, 4):
        _save(tmp_path, step, keep=2)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_00000003.pt", "step_00000004.pt"]
    state, path, problems = latest_checkpoint(tmp_path)
    assert state["step"] == 4 and torch.equal(state["w"], torch.full((4,), 4.0)) and problems == []


def test_damaged_newest_falls_back_to_the_previous(tmp_path):
    _save(tmp_path, 1)
    newest = _save(tmp_path, 2)
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    newest.write_bytes(bytes(data))
    state, path, problems = latest_checkpoint(tmp_path)
    assert state["step"] == 1
    assert problems == ["step_00000002.pt: checksum mismatch, the file is damaged; skipped"]


def test_interrupted_save_is_skipped_and_its_temp_file_removed(tmp_path):
    _save(tmp_path, 1)
    _save(tmp_path, 2).with_name("step_00000002.pt.sha256").unlink()  # killed before the checksum landed
    (tmp_path / "step_00000003.pt.tmp").write_bytes(b"half")  # killed while writing
    state, _path, problems = latest_checkpoint(tmp_path)
    assert state["step"] == 1
    assert any("unfinished write" in p for p in problems) and any("no checksum file" in p for p in problems)
    assert not (tmp_path / "step_00000003.pt.tmp").exists()


def test_empty_folder_means_a_fresh_start(tmp_path):
    assert latest_checkpoint(tmp_path / "none") == (None, None, [])


def test_a_disk_that_fills_while_saving_stops_every_rank_and_loses_no_checkpoint(tmp_path, corpus):
    """ENOSPC while rank 1 writes its shard of the step-4 checkpoint (each rank writes its own: DCP) on 2 gloo ranks:
    both ranks stop with one line naming the folder and the fix, no partial file stays, the previous checkpoint is
    intact, and the same command, once there is room, resumes from it and redoes the lost steps bit for bit."""
    import os
    from pathlib import Path

    from toolkit.runs.folder import read_metrics

    from .test_runner import toolkit_train

    out = tmp_path / "run"
    args = ("--steps", "4", "--global-batch", "4", "--checkpoint-every", "2", "--nproc", "2", "--data", str(corpus))
    faults = str(Path(__file__).parent / "faults")
    env = {
        "PYTHONPATH": os.pathsep.join([faults, os.environ.get("PYTHONPATH", "")]),
        "TOOLKIT_TEST_FULL_DISK": "step_00000004.dcp.tmp/__1_0.distcp",
    }
    full = toolkit_train(out, *args, env=env)
    assert full.returncode == 3, full.stderr
    lines = [line for line in full.stderr.splitlines() if line.startswith("toolkit train:")]
    assert len(lines) == 1 and "step 4 could not be written" in lines[0] and "No space left on device" in lines[0]
    assert "step_00000002.pt, is intact" in lines[0] and "free space" in lines[0]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [
        "step_00000002.dcp",
        "step_00000002.pt",
        "step_00000002.pt.sha256",
    ]
    before = read_metrics(out / "metrics.jsonl")
    assert [r["step"] for r in before] == [1, 2, 3, 4]
    again = toolkit_train(out, *args)
    assert again.returncode == 0, again.stderr
    after = read_metrics(out / "metrics.jsonl")
    assert [(r["step"], r["loss"], r["grad_norm"]) for r in after] == [
        (r["step"], r["loss"], r["grad_norm"]) for r in before
    ]  # steps 3 and 4 redone, bit for bit
    assert sorted(p.name for p in (out / "checkpoints").iterdir())[-1] == "step_00000004.pt.sha256"
