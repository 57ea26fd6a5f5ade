"""The doctor: each fix is a real job whose estimate says what the fix claims; runs are read for symptoms."""
import json

import pytest

from toolkit.estimate import estimate
from toolkit.plan.doctor import diagnose_job, diagnose_run
from toolkit.specs import Job


def test_fixes_for_a_job_that_does_not_fit(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-70b"}, "cluster": {"accelerator": "H100-SXM", "count": 64},
                         "parallel": {"tp": 8, "pp": 4, "zero": 1}, "precision": {"mode": "mixed-bf16"}}, catalog)
    report = diagnose_job(job, catalog)
    assert not report["fits"] and any("out of memory" in f for f in report["findings"])
    fitting = [f for f in report["fixes"] if f["fits"]]
    assert fitting and report["fixes"][:len(fitting)] == fitting          # fitting fixes first
    steps = [f["step_change"] for f in fitting]
    assert steps == sorted(steps)                                          # cheapest first
    for fix in report["fixes"][:4]:
        est = estimate(Job.from_dict(fix["job"], catalog), catalog)
        assert est["memory"]["peak_bytes"] == pytest.approx(fix["peak_bytes"])
        assert est["memory"]["fits"] == fix["fits"]
    assert any(f["change"] == "sequence parallelism" and f["fits"] for f in report["fixes"])


def test_no_single_fix_so_changes_are_combined(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-7b"}, "cluster": {"accelerator": "A100-80GB", "count": 8},
                         "precision": {"mode": "mixed-bf16"}, "batch": {"micro_batch": 4}}, catalog)
    report = diagnose_job(job, catalog)
    assert not any(f["fits"] for f in report["fixes"])
    combined = report["combined"]
    assert combined["fits"] and len(combined["changes"]) >= 2
    assert estimate(Job.from_dict(combined["job"], catalog), catalog)["memory"]["fits"] is True


def test_a_slow_pipeline_is_named(catalog):
    job = Job.from_dict({"model": {"preset": "llama2-13b"}, "cluster": {"accelerator": "H100-SXM", "count": 16},
                         "parallel": {"pp": 8}, "precision": {"mode": "mixed-bf16"},
                         "batch": {"micro_batch": 1, "global_batch": 16}}, catalog)
    report = diagnose_job(job, catalog)
    assert report["fits"] and any("pipeline bubble" in f for f in report["findings"])
    assert report["fixes"] and all(f["step_change"] < 0 for f in report["fixes"])


def _write(tmp_path, records):
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return diagnose_run(tmp_path)["findings"]


def test_run_symptoms(tmp_path):
    base = {"lr": 1e-3, "grad_norm": 1.0, "time_s": 0.1, "skipped": False, "loss_scale": None}
    ok = [dict(base, step=i, loss=5 - i * 0.1) for i in range(1, 21)]
    assert _write(tmp_path, ok) == ["nothing abnormal in the metrics"]
    skipping = [dict(r, skipped=i % 2 == 0, loss_scale=65536.0 / 2 ** (i // 2)) for i, r in enumerate(ok)]
    assert any("fp16 overflow" in f for f in _write(tmp_path, skipping))
    stalls = [dict(r, time_s=0.5 if i % 5 == 0 else 0.1) for i, r in enumerate(ok)]
    assert any("uneven steps" in f for f in _write(tmp_path, stalls))
    diverged = ok[:5] + [{"step": 6, "loss": None, "stopped": "diverged"}]
    assert any("diverged at step 6" in f for f in _write(tmp_path, diverged))
