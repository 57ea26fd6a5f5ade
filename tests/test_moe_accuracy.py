"""The visible MoE validation set (benchmarks/reference/moe_runs.json) and its results (benchmarks/moe_accuracy.py):
every row sourced and measured, every estimable row estimated, and the step-time model's mean error held to the bound
the results file records (its mean rounded up to the next 5 %), so a regression of the model fails here."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "reference" / "moe_runs.json"
RESULTS = ROOT / "benchmarks" / "results" / "moe_accuracy.json"

MEAN_ABS_ERROR_BOUND = 0.20
"""benchmarks/results/moe_accuracy.json records a mean |modelled / measured - 1| of 14.6 % over 14 rows (the catalog
as shipped, nothing fitted); rounded up to the next 5 %: 20 %. Raise it only with a new results file that says why."""

MEASURED_KINDS = ("step_s", "tokens_per_s", "tokens_per_s_per_gpu", "tflops_per_gpu")


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return json.loads(REFERENCE.read_text())["rows"]


@pytest.fixture(scope="module")
def results() -> dict:
    assert RESULTS.exists(), "run: .venv/bin/python benchmarks/moe_accuracy.py"
    return json.loads(RESULTS.read_text())


def test_every_row_has_a_source_and_a_measured_figure(rows):
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "row ids repeat"
    for r in rows:
        assert r["source"]["title"] and r["source"]["url"].startswith("https://"), r["id"]
        assert r["source"].get("read"), f"{r['id']}: say what was read, at which commit"
        assert r["source_group"], r["id"]
        kinds = [k for k in MEASURED_KINDS if k in r["measured"]]
        assert len(kinds) == 1 and r["measured"][kinds[0]] > 0, f"{r['id']}: one measured figure"
        if kinds == ["tflops_per_gpu"]:
            assert r["measured"]["convention"] == "megatron-core", r["id"]
        assert {"model", "parallel", "batch", "precision", "cluster"} <= set(r), r["id"]
        assert r.get("skip") is None or r["skip"].strip(), r["id"]


def test_no_nemo_or_megatron_bridge_performance_tables(rows):
    """Those tables are kept aside to judge the model: never in the visible set."""
    for r in rows:
        text = json.dumps(r["source"]).lower()
        assert "megatron-bridge" not in text and "performance-summary" not in text and "nemo" not in text, r["id"]


def test_the_results_file_estimates_every_row_that_is_not_skipped(rows, results):
    assert {"date", "commit", "machine"} <= set(results)
    by_id = {r["id"]: r for r in results["rows"]}
    assert set(by_id) == {r["id"] for r in rows}, "results out of date: rerun benchmarks/moe_accuracy.py"
    for r in rows:
        done = by_id[r["id"]]
        if r.get("skip"):
            assert "skipped" in done, r["id"]
        else:
            assert "refused" not in done, f"{r['id']} refused: {done.get('refused')}"
            assert done["measured_step_s"] > 0 and done["modelled_step_s"] > 0, r["id"]
    errors = [abs(d["error"]) for d in results["rows"] if "error" in d]
    assert results["summary"]["refused"] == 0
    assert results["summary"]["rows"] == len(errors) == sum(not r.get("skip") for r in rows)
    assert results["summary"]["mean_abs_error"] == pytest.approx(statistics.mean(errors))
    assert results["summary"]["mean_abs_error"] <= MEAN_ABS_ERROR_BOUND


def test_the_model_today_stays_within_the_recorded_bound(rows):
    """The same rows estimated now (about 0.5 s): none refused, the mean error within the bound."""
    from benchmarks.moe_accuracy import evaluate, summary

    fresh = evaluate(rows)
    refused = [f"{r['id']}: {r['refused']}" for r in fresh if "refused" in r]
    assert refused == []
    figures = summary(fresh)
    assert figures["rows"] == sum(not r.get("skip") for r in rows)
    assert figures["mean_abs_error"] <= MEAN_ABS_ERROR_BOUND, f"mean |error| {figures['mean_abs_error']:.1%}"


def test_megatron_flop_count_reproduces_the_published_tflops(rows):
    """Where a source prints a step time and a TFLOP/s beside it, Megatron-Core's count (used to turn the other
    rows' TFLOP/s into step times) gives back that TFLOP/s within 1 %."""
    from benchmarks.moe_accuracy import evaluate

    checks = [r["megatron_flops_check"] for r in evaluate(rows) if "megatron_flops_check" in r]
    assert checks and max(abs(c["deviation"]) for c in checks) < 0.01
