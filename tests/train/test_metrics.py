"""The metrics stream: readers skip a half-written line; a resume drops the steps after the checkpoint."""

import json

from toolkit.runs.folder import read_metrics
from toolkit.train.metrics import MetricsLog


def test_resume_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, 0)
    for step in range(1, 8):
        log.write({"step": step, "loss": 1.0 / step})
    log.close()
    log = MetricsLog(path, 5)  # resumed from the step-5 checkpoint
    for step in range(6, 9):
        log.write({"step": step, "loss": 2.0})
    log.close()
    assert [r["step"] for r in read_metrics(path)] == list(range(1, 9))
    assert read_metrics(path)[5]["loss"] == 2.0


def test_partial_last_line_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 1}]
    MetricsLog(path, 10).close()  # and a resume does not carry it forward
    assert path.read_text() == json.dumps({"step": 1}) + "\n"


def test_tail_reads_only_new_complete_lines_and_restarts_after_a_rewrite(tmp_path):
    from toolkit.runs.folder import MetricsTail

    path = tmp_path / "metrics.jsonl"
    tail = MetricsTail(path)
    assert tail.poll() == 0
    log = MetricsLog(path, 0)
    for step in (1, 2, 3):
        log.write({"step": step})
    assert tail.poll() == 3 and tail.poll() == 0
    with open(path, "a") as f:
        f.write('{"step": 4}\n{"step": 5, "lo')  # a line still being written
    assert tail.poll() == 1 and [r["step"] for r in tail.records] == [1, 2, 3, 4]
    with open(path, "a") as f:
        f.write('ss": 1.0}\n')
    assert tail.poll() == 1 and tail.records[-1] == {"step": 5, "loss": 1.0}
    log.close()
    MetricsLog(path, 2).close()  # a resume from step 2 rewrites the file
    tail.poll()
    assert [r["step"] for r in tail.records] == [1, 2]


def test_tail_notices_a_rewrite_that_grew_past_its_offset(tmp_path):
    from toolkit.runs.folder import MetricsTail

    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, 0)
    log.write({"step": 1})
    log.close()
    tail = MetricsTail(path)
    tail.poll()
    log = MetricsLog(path, 1)  # resumed: the file is replaced, then grows quickly
    for step in range(2, 10):
        log.write({"step": step, "note": "x" * 50})
    log.close()
    tail.poll()
    assert [r["step"] for r in tail.records] == list(range(1, 10))


def test_a_damaged_line_is_skipped_named_and_kept_aside_on_resume(tmp_path):
    """A line overwritten in the middle (NUL bytes from a crash, as ext4 leaves them) and one cut mid-write at the
    end: the readers keep every good record after the damage, name the bad line, and a resume's rewrite copies
    the file aside first, so nothing that was on disk is lost."""
    from toolkit.runs.folder import damaged_lines_note
    from toolkit.train.metrics import MetricsLog

    path = tmp_path / "metrics.jsonl"
    good = [json.dumps({"step": s, "loss": 5.0 - s}) for s in (1, 2, 3)]
    original = (good[0] + "\n" + "\0" * 17 + "\n" + good[1] + "\n" + good[2] + "\n" + '{"step": 4, "lo').encode()
    path.write_bytes(original)
    assert [r["step"] for r in read_metrics(path)] == [1, 2, 3]
    note = damaged_lines_note(path)
    assert str(path) in note and "line 2 " in note and "3 records" in note
    log = MetricsLog(path, resume_step=2)
    log.close()
    assert [r["step"] for r in read_metrics(path)] == [1, 2]
    assert (tmp_path / "metrics.jsonl.damaged").read_bytes() == original and "metrics.jsonl.damaged" in log.note
    assert damaged_lines_note(path) is None
