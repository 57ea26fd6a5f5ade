"""Checkpoints: the newest valid one loads; an interrupted or damaged one is reported and skipped."""
import torch

from toolkit.train.checkpoint import latest_checkpoint, list_checkpoints, save_checkpoint


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
    _save(tmp_path, 2).with_name("step_00000002.pt.sha256").unlink()    # killed before the checksum landed
    (tmp_path / "step_00000003.pt.tmp").write_bytes(b"half")            # killed while writing
    state, _path, problems = latest_checkpoint(tmp_path)
    assert state["step"] == 1
    assert any("unfinished write" in p for p in problems) and any("no checksum file" in p for p in problems)
    assert not (tmp_path / "step_00000003.pt.tmp").exists()


def test_empty_folder_means_a_fresh_start(tmp_path):
    assert latest_checkpoint(tmp_path / "none") == (None, None, [])
