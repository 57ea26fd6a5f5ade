"""The metrics stream: readers skip a half-written line; a resume drops the steps after the checkpoint."""
import json

from toolkit.train.metrics import MetricsLog, read_metrics


def test_resume_keeps_each_step_once(tmp_path):
    path = tmp_path / "metrics.jsonl"
    log = MetricsLog(path, 0)
    for step in range(1, 8):
        log.write({"step": step, "loss": 1.0 / step})
    log.close()
    log = MetricsLog(path, 5)            # resumed from the step-5 checkpoint
    for step in range(6, 9):
        log.write({"step": step, "loss": 2.0})
    log.close()
    assert [r["step"] for r in read_metrics(path)] == list(range(1, 9))
    assert read_metrics(path)[5]["loss"] == 2.0


def test_partial_last_line_is_ignored(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 1}) + "\n" + '{"step": 2, "lo')
    assert read_metrics(path) == [{"step": 1}]
    MetricsLog(path, 10).close()         # and a resume does not carry it forward
    assert path.read_text() == json.dumps({"step": 1}) + "\n"
